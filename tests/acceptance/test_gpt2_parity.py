"""GPT-2 family against HuggingFace (eager attention, float32): logits, residual stream, loss, padding."""

import pytest
import torch
import torch.nn.functional as F

from tests.helpers import hf_block_outputs
from tests.tiny_models import hooked_from, tiny_gpt2

CONFIGS = {
    "default_gelu_new": {},
    "relu_n_inner": dict(activation_function="relu", n_inner=96),
    "gelu_inverse_layer_scale": dict(activation_function="gelu", scale_attn_by_inverse_layer_idx=True, n_layer=3),
    "gelu_fast_no_attn_scale": dict(activation_function="gelu_fast", scale_attn_weights=False, n_head=8),
}


@pytest.fixture(params=list(CONFIGS), scope="module")
def pair(request):
    hf = tiny_gpt2(seed=len(request.param), **CONFIGS[request.param])
    return hf, hooked_from(hf)


def tokens(batch=3, pos=24, vocab=1000, seed=0):
    return torch.randint(0, vocab, (batch, pos), generator=torch.Generator().manual_seed(seed))


def test_logits_match_hf(pair):
    hf, model = pair
    t = tokens()
    with torch.no_grad():
        ref = hf(t).logits
        ours = model(t)
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=0)


def test_every_resid_post_matches_hf_block_output(pair):
    hf, model = pair
    t = tokens()
    ref = hf_block_outputs(hf, hf.transformer.h, t)
    with torch.no_grad():
        _, cache = model.run_with_cache(t, names_filter=lambda n: n.endswith("hook_resid_post"))
    assert len(ref) == model.cfg.n_layers
    for layer, hidden in enumerate(ref):
        torch.testing.assert_close(cache["resid_post", layer], hidden, atol=1e-5, rtol=0)


def test_loss_matches_hf(pair):
    hf, model = pair
    t = tokens()
    with torch.no_grad():
        ref = hf(t, labels=t).loss
        ours = model(t, return_type="loss")
    assert abs(ours.item() - ref.item()) <= 1e-6


def test_sdpa_and_explicit_paths_agree(pair):
    _, model = pair
    t = tokens()
    with torch.no_grad():
        fast = model(t)  # nothing observes the pattern: SDPA
        _, cache = model.run_with_cache(t, names_filter="blocks.0.attn.hook_pattern")  # explicit in layer 0
        model.cfg.attn_implementation = "eager"
        try:
            explicit = model(t)
        finally:
            model.cfg.attn_implementation = "auto"
    assert cache["pattern", 0].shape == (3, model.cfg.n_heads, 24, 24)
    torch.testing.assert_close(fast, explicit, atol=1e-5, rtol=0)


def _left_pad(seqs, pad_id=0):
    width = max(len(s) for s in seqs)
    toks = torch.full((len(seqs), width), pad_id)
    mask = torch.zeros(len(seqs), width, dtype=torch.long)
    for i, s in enumerate(seqs):
        toks[i, width - len(s) :], mask[i, width - len(s) :] = s, 1
    return toks, mask


@pytest.mark.parametrize("implementation", ["auto", "eager"])
def test_left_padded_batch_equals_each_prompt_alone(pair, implementation):
    _, model = pair
    seqs = [tokens(1, n, seed=n)[0] for n in (5, 17, 11)]
    toks, mask = _left_pad(seqs)
    model.cfg.attn_implementation = implementation
    try:
        with torch.no_grad():
            batched = model(toks, attention_mask=mask)
            for i, s in enumerate(seqs):
                alone = model(s[None])[0]
                torch.testing.assert_close(batched[i, -len(s) :], alone, atol=1e-5, rtol=0)
    finally:
        model.cfg.attn_implementation = "auto"


def test_pad_positions_do_not_count_in_loss(pair):
    _, model = pair
    seqs = [tokens(1, n, seed=n)[0] for n in (6, 13)]
    toks, mask = _left_pad(seqs)
    with torch.no_grad():
        per_token = model(toks, attention_mask=mask, return_type="loss", loss_per_token=True)
        batch_loss = model(toks, attention_mask=mask, return_type="loss")
        alone = [model(s[None], return_type="loss", loss_per_token=True)[0] for s in seqs]
    assert per_token.shape == (2, toks.shape[1] - 1)
    assert (per_token[0, : toks.shape[1] - len(seqs[0])] == 0).all()
    manual = torch.cat(alone)
    torch.testing.assert_close(batch_loss, manual.mean(), atol=1e-6, rtol=0)
    ref = F.cross_entropy(model(seqs[0][None])[0, :-1], seqs[0][1:])
    torch.testing.assert_close(alone[0].mean(), ref, atol=1e-6, rtol=0)
