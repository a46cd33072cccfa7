"""Apertus (qk-norm attention, dense xIELU MLP) against HuggingFace eager on a tiny random model."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hooked import HookedTransformer
from hooked.generation.kv_cache import HookedTransformerKeyValueCache
from hooked.loading import supported_architectures
from tests.helpers import hf_block_outputs
from tests.tiny_models import NO_PROCESSING


@pytest.fixture(scope="module", autouse=True)
def no_grad():
    """Grad off for this module only (a module-level `torch.set_grad_enabled(False)` leaked into later test files)."""
    with torch.no_grad():
        yield


@pytest.fixture(scope="module")
def hf():
    from transformers import ApertusConfig, ApertusForCausalLM

    torch.manual_seed(0)
    config = ApertusConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=100,
        max_position_embeddings=128,
        attn_implementation="eager",
        dtype=torch.float32,
    )
    model = ApertusForCausalLM(config).eval()
    for name, p in model.named_parameters():  # random norm gains and xIELU parameters, so parity covers them
        if "norm" in name or "act_fn" in name:
            p.add_(torch.randn_like(p) * 0.3)
    model.generation_config.eos_token_id = None
    return model


@pytest.fixture(scope="module")
def model(hf):
    return HookedTransformer.from_pretrained("apertus", hf_model=hf, **NO_PROCESSING)


@pytest.fixture(scope="module")
def tokens():
    return torch.randint(0, 100, (2, 12), generator=torch.Generator().manual_seed(1))


def test_registered():
    assert "ApertusForCausalLM" in supported_architectures()


def test_logits_and_every_resid_post_match_hf(hf, model, tokens):
    logits, cache = model.run_with_cache(tokens)
    torch.testing.assert_close(logits, hf(tokens).logits, rtol=0, atol=1e-5)
    for layer, hf_out in enumerate(hf_block_outputs(hf, hf.model.layers, tokens)):
        torch.testing.assert_close(cache["resid_post", layer], hf_out, rtol=0, atol=1e-5)
    assert model.blocks[0].mlp.act_fn.alpha_p.item() == hf.model.layers[0].mlp.act_fn.alpha_p.item()


def test_processed_log_probs_match_unprocessed(hf, model, tokens):
    processed = HookedTransformer.from_pretrained("apertus", hf_model=hf)
    torch.testing.assert_close(
        F.log_softmax(processed(tokens), -1), F.log_softmax(model(tokens), -1), rtol=0, atol=1e-5
    )


def test_kv_cached_equals_full_forward(model, tokens):
    cache = HookedTransformerKeyValueCache.init_cache(model.cfg, model.cfg.device, tokens.shape[0])
    first = model(tokens[:, :7], past_kv_cache=cache)
    rest = model(tokens[:, 7:], past_kv_cache=cache)
    torch.testing.assert_close(torch.cat([first, rest], 1), model(tokens), rtol=0, atol=1e-5)


def test_greedy_20_tokens_match_hf(hf, model, tokens):
    ours = model.generate(tokens[:1], max_new_tokens=20, do_sample=False, stop_at_eos=False, verbose=False)
    theirs = hf.generate(tokens[:1], max_new_tokens=20, do_sample=False)
    assert torch.equal(ours, theirs)
