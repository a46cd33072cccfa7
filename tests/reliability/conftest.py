"""Shared fixtures for the bad-input and fault tests: tiny models and the `unchanged` guard.

`unchanged(model, *tokenizers)` snapshots everything a failed call must not touch (the
logits of a probe input, every hook and the context level, the config, the weights, the
model's tokenizer and any caller-owned tokenizers) and asserts, on exit, that all of it
is exactly as before. Every fault test wraps its `pytest.raises` in it.
"""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch

from tests.tiny_models import hooked_from, make_tokenizer, tiny_gpt2

PROBE = torch.tensor([[3, 17, 42, 7, 99, 5]])  # [batch, pos]


def tokenizer_state(tok) -> tuple:
    specials = tuple(getattr(tok, a) for a in ("bos_token", "eos_token", "pad_token", "unk_token"))
    return specials + (tok.padding_side, tok.truncation_side, len(tok), tok.model_max_length)


def snapshot(model, tokenizers) -> dict:
    with torch.no_grad():
        logits = model(PROBE).clone()
    return dict(
        logits=logits,
        hooks={
            name: [(id(h.hook), h.is_permanent, h.context_level) for h in hs] for name, hs in model.list_hooks().items()
        },
        torch_hooks=sum(len(hp._forward_hooks) + len(hp._forward_pre_hooks) for hp in model.hook_dict.values()),
        context_level=model.context_level,
        cfg=copy.deepcopy(model.cfg.to_dict()),
        weights={k: v.detach().clone() for k, v in model.state_dict().items()},
        tokenizer=None if model.tokenizer is None else tokenizer_state(model.tokenizer),
        tokenizer_id=id(model.tokenizer),
        callers=[tokenizer_state(t) for t in tokenizers],
    )


def assert_same(before: dict, after: dict) -> None:
    assert torch.equal(before["logits"], after["logits"]), "the model's outputs changed"
    for key in ("hooks", "torch_hooks", "context_level", "cfg", "tokenizer", "tokenizer_id", "callers"):
        assert before[key] == after[key], f"{key} changed: {before[key]} -> {after[key]}"
    assert before["weights"].keys() == after["weights"].keys()
    for name, w in before["weights"].items():
        assert torch.equal(w, after["weights"][name]), f"weight {name} changed"


@contextlib.contextmanager
def _unchanged(model, *tokenizers):
    before = snapshot(model, tokenizers)
    yield
    assert_same(before, snapshot(model, tokenizers))


@pytest.fixture
def unchanged():
    """`with unchanged(model, *caller_tokenizers), pytest.raises(...):` -- the fault leaves everything as it was."""
    return _unchanged


@pytest.fixture(scope="session")
def tok():
    return make_tokenizer(vocab_size=300)


@pytest.fixture(scope="session")
def model(tok):
    """A tiny GPT-2 (2 layers, d_model 64, d_vocab 1000, n_ctx 128) with a trained tokenizer."""
    return hooked_from(tiny_gpt2(), tokenizer=tok)


@pytest.fixture(scope="session")
def llama():
    """A tiny LLaMA (rotary, GQA, RMSNorm, gated MLP) without a tokenizer."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from hooked import HookedTransformer

    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=120, max_position_embeddings=64, attn_implementation="eager",
    )  # fmt: skip
    hf = LlamaForCausalLM(config).eval()
    return HookedTransformer.from_pretrained_no_processing("llama", hf_model=hf)
