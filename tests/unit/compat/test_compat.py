"""`alias_transformer_lens()`: TransformerLens 2.x module paths and names resolve to hooked, with TL semantics."""

from __future__ import annotations

import copy
import importlib
import importlib.metadata

import pytest
import torch
import torch.nn.functional as F

from hooked import HookedTransformer, HookedTransformerConfig
from hooked.compat import TL_MODULES, alias_transformer_lens, tl_state_dict, unalias_transformer_lens

alias_transformer_lens()
import transformer_lens  # noqa: E402
import transformer_lens.utils as tl_utils  # noqa: E402


def tiny(**overrides) -> HookedTransformer:
    cfg = dict(n_layers=2, d_model=32, d_head=8, n_ctx=16, d_vocab=40, act_fn="gelu_new", seed=0, device="cpu")
    cfg.update(overrides)
    return HookedTransformer(HookedTransformerConfig(**cfg))


@pytest.mark.parametrize("path", sorted(TL_MODULES))
def test_every_module_path_imports_and_is_reachable_by_attribute(path):
    module = importlib.import_module(path)
    obj = transformer_lens
    for part in path.split(".")[1:]:
        obj = getattr(obj, part)
    # as in TransformerLens, a class shadows its module of the same name (transformer_lens.HookedTransformer)
    assert obj is module or obj is getattr(module, path.rsplit(".", 1)[-1])


def test_names_course_code_and_sae_lens_import():
    import transformer_lens.components as c
    from transformer_lens import ActivationCache, FactoredMatrix  # noqa: F401
    from transformer_lens import HookedTransformer as TLHookedTransformer
    from transformer_lens.components.mlps.can_be_used_as_mlp import CanBeUsedAsMLP
    from transformer_lens.HookedTransformer import Loss, LossPerToken, Output, SingleLoss  # noqa: F401
    from transformer_lens.loading_from_pretrained import OFFICIAL_MODEL_NAMES  # noqa: F401

    assert TLHookedTransformer is HookedTransformer and c.MLP.__name__ == "MLP"
    assert tl_utils.USE_DEFAULT_VALUE is None
    with pytest.raises(ValueError):
        CanBeUsedAsMLP(HookedTransformerConfig(n_layers=1, d_model=8, d_head=4, n_ctx=4, d_vocab=5, attn_only=True))


def test_version_metadata_answers_for_the_alias():
    version = importlib.metadata.version("transformer-lens")
    assert version.startswith("2.") and version == transformer_lens.__version__


def test_activation_functions_match_their_definitions():
    x = torch.linspace(-4, 4, 101)
    torch.testing.assert_close(tl_utils.gelu_new(x), F.gelu(x, approximate="tanh"), atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(tl_utils.gelu_fast(x), F.gelu(x, approximate="tanh"), atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(tl_utils.solu(x[None]), x[None] * x[None].softmax(-1))


def test_tensor_helpers():
    t = torch.arange(64.0).reshape(4, 4, 4)
    assert tl_utils.get_corner(t, 2).shape == (2, 2, 2)
    torch.testing.assert_close(tl_utils.transpose(t), t.transpose(-1, -2))
    assert tl_utils.calc_fan_in_and_fan_out(torch.empty(3, 5, 7)) == (5, 21)
    w = tl_utils.init_xavier_normal_(torch.empty(400, 600))
    assert abs(w.std().item() - (2 / 1000) ** 0.5) < 2e-3
    logits = torch.tensor([[0.0, 5.0, 1.0], [3.0, 0.0, 0.0]])
    assert tl_utils.sample_logits(logits, temperature=0.0).tolist() == [1, 0]
    assert tl_utils.sample_logits(logits, top_k=1).tolist() == [1, 0]


def test_composition_scores_match_the_model():
    model = tiny()
    OV, QK = model.OV, model.QK
    score = tl_utils.composition_scores(OV[0, 1], QK[1, 2])
    torch.testing.assert_close(score, model.all_composition_scores("Q")[0, 1, 1, 2])


def test_tl_assertion_errors_stay_assertion_errors():
    with pytest.raises(AssertionError):
        tl_utils.sample_logits(torch.zeros(1, 3), top_k=0)
    with pytest.raises(AssertionError):
        HookedTransformerConfig(n_layers=1, d_model=10, d_head=3, n_ctx=4, d_vocab=5, act_fn="relu")


def test_errors_transformer_lens_asserts_are_assertion_errors(tokenizer):
    cfg = dict(n_layers=1, d_model=32, d_head=8, n_ctx=16, n_key_value_heads=2, act_fn="relu", device="cpu")
    model = HookedTransformer(HookedTransformerConfig(**cfg), tokenizer=tokenizer)
    for call in (
        lambda: model.to_single_token("The quick brown fox"),
        lambda: model.set_use_attn_in(True),
        lambda: model.run_with_cache(torch.tensor([[1, 2], [3, 4]]))[1].remove_batch_dim(),
        lambda: model.to_str_tokens(torch.tensor([[1, 2], [3, 4]])),
        lambda: HookedTransformer(HookedTransformerConfig(n_layers=1, d_model=8, d_head=4, n_ctx=4, act_fn="relu")),
    ):
        with pytest.raises(AssertionError):
            call()
        with pytest.raises(ValueError):
            call()


def test_tokens_with_bos_removed(bos_tokenizer):
    tokenizer = copy.deepcopy(bos_tokenizer)
    bos, pad = tokenizer.bos_token_id, tokenizer.pad_token_id
    tokens = torch.tensor([[bos, 7, 8], [bos, 9, pad]])
    torch.testing.assert_close(tl_utils.get_tokens_with_bos_removed(tokenizer, tokens), tokens[:, 1:])
    tokenizer.padding_side = "left"
    tokens = torch.tensor([[pad, bos, 7, 8], [bos, 9, 8, 6]])
    expected = torch.tensor([[pad, 7, 8], [9, 8, 6]])
    torch.testing.assert_close(tl_utils.get_tokens_with_bos_removed(tokenizer, tokens), expected)


def test_tokenize_and_concatenate(bos_tokenizer):
    tokenizer = bos_tokenizer
    from datasets import Dataset

    from tests.tiny_models import CORPUS

    data = tl_utils.tokenize_and_concatenate(
        Dataset.from_dict({"text": CORPUS, "id": list(range(5))}), tokenizer, max_length=8, streaming=True
    )
    tokens = data[:]["tokens"]
    assert tokens.shape[1] == 8 and (tokens[:, 0] == tokenizer.bos_token_id).all()
    stream = tokenizer(tokenizer.eos_token.join(CORPUS), add_special_tokens=False)["input_ids"]
    assert tokens[:, 1:].reshape(-1).tolist() == stream[: tokens.shape[0] * 7]


def test_enable_hook_adds_at_the_current_context_level():
    model = tiny()
    seen = []
    with model.hooks():
        model._enable_hook("blocks.0.hook_resid_pre", lambda x, hook: seen.append(hook.name), "fwd")
        model(torch.tensor([[1, 2, 3]]))
    model(torch.tensor([[1, 2, 3]]))
    assert seen == ["blocks.0.hook_resid_pre"]


@pytest.mark.parametrize(
    "overrides",
    [{}, dict(positional_embedding_type="rotary", rotary_dim=4, n_key_value_heads=2, gated_mlp=True, act_fn="silu")],
)
def test_tl_state_dict_has_transformer_lens_buffers_and_loads_back(overrides):
    model = tiny(**overrides)
    state = tl_state_dict(model)
    n_ctx = model.cfg.n_ctx
    torch.testing.assert_close(state["blocks.1.attn.mask"], torch.ones(n_ctx, n_ctx, dtype=torch.bool).tril())
    assert state["blocks.0.attn.IGNORE"].item() == float("-inf")
    assert not any(k.endswith("b_gate") for k in state)  # TransformerLens's GatedMLP has no gate bias
    if overrides:  # TL's rotation with its tables equals hooked's rotated queries
        tokens = torch.tensor([[1, 2, 3, 4, 5]])
        _, cache = model.run_with_cache(tokens)
        q = cache["q", 0][..., :4]
        sin, cos = state["blocks.0.attn.rotary_sin"][:5, None], state["blocks.0.attn.rotary_cos"][:5, None]
        rotated = q * cos + torch.cat([-q[..., 2:], q[..., :2]], dim=-1) * sin
        torch.testing.assert_close(rotated, cache["rot_q", 0][..., :4], atol=1e-5, rtol=1e-5)
    other = tiny(seed=1, **overrides)
    other.load_state_dict(state, strict=True)
    tokens = torch.tensor([[1, 2, 3]])
    torch.testing.assert_close(other(tokens), model(tokens))


def test_evals_on_a_tiny_model(tokenizer):
    from transformer_lens import evals

    model = HookedTransformer(
        HookedTransformerConfig(n_layers=1, d_model=32, d_head=8, n_ctx=64, act_fn="relu", device="cpu", seed=0),
        tokenizer=tokenizer,
    )
    torch.testing.assert_close(evals.sanity_check(model), model(evals.SANITY_TEXT, return_type="loss"))
    batches = [{"tokens": torch.randint(0, 300, (2, 8))} for _ in range(3)]
    expected = sum(model(b["tokens"], return_type="loss").item() for b in batches[:2]) / 2
    assert abs(evals.evaluate_on_dataset(model, batches, truncate=1) - expected) < 1e-6
    assert evals.induction_loss(model, batch_size=2, subseq_len=8).ndim == 0


def test_unalias_removes_the_tree_and_alias_restores_it():
    import sys

    unalias_transformer_lens()
    try:
        assert not any(name == "transformer_lens" or name.startswith("transformer_lens.") for name in sys.modules)
        with pytest.raises(importlib.metadata.PackageNotFoundError):
            importlib.metadata.version("transformer-lens")
    finally:
        assert sorted(alias_transformer_lens(strict=True)) == sorted(TL_MODULES)
    assert importlib.import_module("transformer_lens.utils") is tl_utils


def test_mmlu_subjects_are_checked_before_loading():
    from hooked.compat.evals import MMLU_SUBJECTS, _mmlu_subjects, make_mmlu_data_loader

    assert len(MMLU_SUBJECTS) == 57 and _mmlu_subjects("anatomy") == ["anatomy"]
    with pytest.raises(ValueError, match="Invalid subject.*'no_such_subject'"):
        make_mmlu_data_loader(subjects=["anatomy", "no_such_subject"])


def test_mmlu_eval_scores_the_letter_with_the_highest_logit(monkeypatch):
    import hooked.compat.evals as evals

    examples = [dict(question="2+2?", choices=["3", "4", "5", "6"], answer=a, subject="s") for a in (0, 1)]
    monkeypatch.setattr(evals, "make_mmlu_data_loader", lambda *args: examples)

    class Letters:  # a tokenizer with " A".." D" as ids 0..3
        def encode(self, text, add_special_tokens=False):
            return [" ABCD".index(text.strip()) - 1]

    def model(prompt, return_type):
        assert prompt.endswith("\nD. 6\nAnswer:")
        return torch.tensor([0.0, 5.0, 1.0, 2.0])[None, None]  # [1, 1, vocab]: " B" wins

    result = evals.mmlu_eval(model, tokenizer=Letters())
    assert (result["num_correct"], result["num_total"], result["subject_scores"]) == (1, 2, {"s": 0.5})
