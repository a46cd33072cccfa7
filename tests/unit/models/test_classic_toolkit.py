"""The analysis toolkit on every classic family (issue 13): processing, hooks, caches, decompositions,
patching, weight views and composition scores. Quick smoke and identity checks on the tiny models."""

from __future__ import annotations

import pytest
import torch

from hooked.core.config import ConfigError
from tests.tiny_models import CLASSIC_FAMILIES, CLASSIC_VOCAB, hooked_from, tiny_classic

ATOL = 1e-5
REFACTORABLE = {"gpt_neo_window4", "opt", "bloom_6heads", "xglm_sinusoidal"}  # no rotary, qk-norm, grouped K/V, clip


def tokens(batch=2, pos=8, seed=0):
    return torch.randint(3, CLASSIC_VOCAB, (batch, pos), generator=torch.Generator().manual_seed(seed))


def max_abs(a, b) -> float:
    return (a - b).abs().max().item()


@pytest.fixture(params=list(CLASSIC_FAMILIES), scope="module")
def family(request):
    hf = tiny_classic(request.param, seed=1)
    return request.param, hf, hooked_from(hf)


def test_processing_flags_refactor_and_idempotence(family):
    from hooked import HookedTransformer

    name, hf, unprocessed = family
    t = tokens()
    with torch.no_grad():
        ref = unprocessed(t).log_softmax(-1)
        refactor = name in REFACTORABLE
        if not refactor:
            with pytest.raises(ConfigError, match="refactor_factored_attn_matrices is not supported"):
                HookedTransformer.from_pretrained("x", hf_model=hf, refactor_factored_attn_matrices=True)
        model = HookedTransformer.from_pretrained("x", hf_model=hf, refactor_factored_attn_matrices=refactor)
        processed = model(t)
        assert max_abs(processed.log_softmax(-1), ref) <= ATOL
        before = {k: v.clone() for k, v in model.state_dict().items()}
        model.process_weights_(refactor_factored_attn_matrices=refactor)  # already applied: a no-op
        assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
        # the difference of logits is constant along the vocabulary
        shift = processed - unprocessed(t)
        assert max_abs(shift, shift.mean(-1, keepdim=True)) <= ATOL


def test_run_with_cache_and_identity_hooks_are_transparent(family):
    _, _, model = family
    t = tokens()
    model.cfg.attn_implementation = "eager"
    try:
        with torch.no_grad():
            plain = model(t)
            cached, cache = model.run_with_cache(t)
            hooked = model.run_with_hooks(t, fwd_hooks=[(lambda n: True, lambda x, hook: x)])
    finally:
        model.cfg.attn_implementation = "auto"
    assert torch.equal(plain, cached) and torch.equal(plain, hooked)
    assert cache["pattern", 0].shape == (2, model.cfg.n_heads, 8, 8)
    assert torch.allclose(cache["pattern", 1].sum(-1), torch.ones(()))


def test_decompositions_and_logit_lens(family):
    _, _, model = family
    t = tokens()
    with torch.no_grad():
        logits, cache = model.run_with_cache(t)
        L = model.cfg.n_layers
        final = cache["resid_post", L - 1]
        assert max_abs(cache.decompose_resid(L).sum(0), final) <= ATOL
        assert max_abs(cache.get_full_resid_decomposition(L, expand_neurons=False).sum(0), final) <= ATOL
        assert max_abs(cache.logit_lens()[-1], logits) <= ATOL


def test_generate_with_hooks_at_steps(family):
    from hooked.core.utils import at_steps

    _, _, model = family
    prompt = tokens(1, 5, seed=3)
    plain = model.generate(prompt, max_new_tokens=6, do_sample=False, verbose=False, stop_at_eos=False)
    seen = []
    identity = model.generate(
        prompt, max_new_tokens=6, do_sample=False, verbose=False, stop_at_eos=False,
        fwd_hooks=[("blocks.0.hook_resid_post", lambda x, hook: seen.append(x.shape[1]) or x)],
    )  # fmt: skip
    assert torch.equal(plain, identity) and seen == [5, 1, 1, 1, 1, 1]
    ablate = at_steps(lambda x, hook: torch.zeros_like(x), slice(0, None), model=model)
    ablated = model.generate(
        prompt, max_new_tokens=6, do_sample=False, verbose=False, stop_at_eos=False,
        fwd_hooks=[("blocks.1.hook_attn_out", ablate)], return_cache=True, names_filter="blocks.1.hook_attn_out",
    )  # fmt: skip
    assert (ablated.cache["blocks.1.hook_attn_out"] == 0).all()


def test_activation_patching_clean_into_clean_is_identity(family):
    from hooked.analysis import patching

    _, _, model = family
    t = tokens(1, 6, seed=4)
    with torch.no_grad():
        clean_logits, cache = model.run_with_cache(t)
    metric = lambda logits: logits[0, -1, 5] - logits[0, -1, 6]  # noqa: E731
    patched = patching.get_act_patch_block_every(model, t, cache, metric)
    assert patched.shape == (3, model.cfg.n_layers, 6)
    assert max_abs(patched, metric(clean_logits).expand_as(patched)) <= ATOL


def test_weight_views_and_composition_scores(family):
    _, _, model = family
    cfg = model.cfg
    L, H, d, dh = cfg.n_layers, cfg.n_heads, cfg.d_model, cfg.d_head
    assert model.W_Q.shape == model.W_K.shape == model.W_V.shape == (L, H, d, dh)
    assert model.W_O.shape == (L, H, dh, d) and model.W_U.shape == (d, cfg.d_vocab_out)
    ov = torch.einsum("lhde,lhef->lhdf", model.W_V, model.W_O)
    assert max_abs(model.OV.AB, ov) <= ATOL
    for mode in "QKV":
        scores = model.all_composition_scores(mode)
        assert scores.shape == (L, H, L, H) and torch.isfinite(scores).all()
        assert (scores[1, :, 0] == 0).all() and (scores[0, :, 1] > 0).all() and (scores <= 1 + 1e-6).all()
