"""Gemma 1, 2 and 3 (and Gemma 3's image-text text tower) against HuggingFace eager attention, float32.

Tiny random HF models whose every parameter is redrawn: projections at a scale where
attention is far from uniform, and Gemma's norm weights `w` drawn around 0 so every gain
`1 + w` differs from 1 (HF initialises `w` at 0, where a lost `+ 1` or an unfolded gain
would not show). Gemma 2 runs with soft-caps small enough to bite, a window shorter than
the sequence and `query_pre_attn_scalar != head_dim`; Gemma 3 with mixed `layer_types`,
different local and global rope bases and `linear` scaling on the global layers.
Every check is two-sided max-abs with rtol 0 (docs/numerics.md#tolerances).
"""

from __future__ import annotations

import pytest
import torch

from tests.helpers import hf_block_outputs
from tests.tiny_models import GEMMA_CONFIGS, VOCAB, gemma_layers, hooked_from, tiny_gemma
from tests.tiny_models import GEMMA_EOS as EOS

ATOL = 1e-5


def tokens(batch=2, pos=12, seed=0):
    return torch.randint(3, VOCAB - 3, (batch, pos), generator=torch.Generator().manual_seed(seed))


def max_abs(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


def left_pad(seqs):
    width = max(len(s) for s in seqs)
    toks = torch.zeros(len(seqs), width, dtype=torch.long)
    mask = torch.zeros(len(seqs), width, dtype=torch.long)
    for i, s in enumerate(seqs):
        toks[i, width - len(s) :], mask[i, width - len(s) :] = s, 1
    return toks, mask


@pytest.fixture(params=list(GEMMA_CONFIGS), scope="module")
def pair(request):
    hf = tiny_gemma(request.param, seed=len(request.param))
    return request.param, hf, hooked_from(hf)


@pytest.fixture(scope="module")
def processed(pair):
    from hooked import HookedTransformer

    _, hf, _ = pair
    return HookedTransformer.from_pretrained("processed", hf_model=hf)


# -- parity ------------------------------------------------------------------------------


def test_logits_match_hf(pair):
    _, hf, model = pair
    t = tokens()
    with torch.no_grad():
        ref, ours = hf(input_ids=t).logits, model(t)
    assert ours.shape == ref.shape
    assert max_abs(ours, ref) <= ATOL


def test_every_resid_post_matches_hf_decoder_layer(pair):
    _, hf, model = pair
    t = tokens()
    ref = hf_block_outputs(hf, gemma_layers(hf), input_ids=t)
    with torch.no_grad():
        _, cache = model.run_with_cache(t, names_filter=lambda n: n.endswith("hook_resid_post"))
    assert len(ref) == model.cfg.n_layers == 2
    for layer, hidden in enumerate(ref):
        assert max_abs(cache["resid_post", layer], hidden) <= ATOL, f"layer {layer}"


def test_loss_matches_hf(pair):
    _, hf, model = pair
    t = tokens()
    with torch.no_grad():
        ref, ours = hf(input_ids=t, labels=t).loss, model(t, return_type="loss")
    assert abs(ours.item() - ref.item()) <= ATOL


def test_processed_log_softmax_matches_unprocessed_and_hf(pair, processed):
    _, hf, model = pair
    t = tokens()
    with torch.no_grad():
        unprocessed, ours = model(t).log_softmax(-1), processed(t).log_softmax(-1)
        ref = hf(input_ids=t).logits.log_softmax(-1)
    assert max_abs(ours, unprocessed) <= ATOL
    assert max_abs(ours, ref) <= ATOL
    with torch.no_grad():
        shift = processed(t) - model(t)  # center_unembed moves each position's logits by one constant
    assert max_abs(shift, shift.mean(-1, keepdim=True)) <= ATOL


@pytest.mark.parametrize("implementation", ["auto", "eager"])
def test_left_padded_batch_rows_equal_prompts_alone(pair, implementation):
    _, _, model = pair
    seqs = [tokens(1, n, seed=n)[0] for n in (5, 12, 9)]
    toks, mask = left_pad(seqs)
    model.cfg.attn_implementation = implementation
    try:
        with torch.no_grad():
            batched = model(toks, attention_mask=mask)
            for i, s in enumerate(seqs):
                assert max_abs(batched[i, -len(s) :], model(s[None])[0]) <= ATOL, f"row {i}"
    finally:
        model.cfg.attn_implementation = "auto"


def test_left_padded_batch_matches_hf_with_position_ids(pair):
    _, hf, model = pair
    toks, mask = left_pad([tokens(1, n, seed=n)[0] for n in (5, 12)])
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        ref = hf(input_ids=toks, attention_mask=mask, position_ids=positions).logits
        ours = model(toks, attention_mask=mask)
    real = mask.bool()
    assert max_abs(ours[real], ref[real]) <= ATOL


@pytest.mark.parametrize("splits", [[5, 1, 6], [1] * 12])
def test_kv_cached_decoding_equals_full_forward(pair, splits):
    from hooked.generation.kv_cache import HookedTransformerKeyValueCache

    _, _, model = pair
    toks, mask = left_pad([tokens(1, n, seed=n)[0] for n in (12, 7, 3)])
    with torch.no_grad():
        full = model(toks, attention_mask=mask)
        cache, start = HookedTransformerKeyValueCache.init_cache(model.cfg, model.cfg.device, 3), 0
        for n in splits:
            chunk = slice(start, start + n)
            logits = model(toks[:, chunk], attention_mask=mask[:, chunk], past_kv_cache=cache)
            real = mask[:, chunk].bool()
            assert max_abs(logits[real], full[:, chunk][real]) <= ATOL
            start += n


def test_greedy_20_tokens_match_hf_generate(pair):
    _, hf, model = pair
    toks, mask = left_pad([tokens(1, n, seed=n)[0] for n in (9, 4)])
    ours = model.generate(
        toks, max_new_tokens=20, attention_mask=mask, do_sample=False, verbose=False, eos_token_id=EOS
    )
    with torch.no_grad():
        theirs = hf.generate(
            input_ids=toks, attention_mask=mask, max_new_tokens=20, do_sample=False, eos_token_id=EOS, pad_token_id=EOS
        )
    assert ours.shape == theirs.shape == (2, 9 + 20)
    assert torch.equal(ours, theirs)


def test_sdpa_and_explicit_paths_agree(pair):
    _, _, model = pair
    toks, mask = left_pad([tokens(1, n, seed=n)[0] for n in (12, 6)])
    with torch.no_grad():
        fast = model(toks, attention_mask=mask)
        model.cfg.attn_implementation = "eager"
        try:
            explicit = model(toks, attention_mask=mask)
        finally:
            model.cfg.attn_implementation = "auto"
    real = mask.bool()
    assert max_abs(fast[real], explicit[real]) <= ATOL
