"""The classic families (issue 13) against HuggingFace eager attention, float32, one parametrized suite.

Families and variants are listed in `tests/tiny_models.CLASSIC_FAMILIES`: GPT-NeoX with and without
parallel residual (rotary fraction 0.25), GPT-J (rotary_dim < d_head), GPT-Neo (window shorter
than the sequence), Phi (partial rotary 0.5), OPT, Bloom (6 heads: not a power of two),
StableLM (per-head qk LayerNorm; parallel), GPT-BigCode (multi-query), StarCoder2, MPT (its own ALiBi,
6 heads, `clip_qkv` that clips), CodeGen (q/v/k fused in 4 shards, adjacent-pair partial rotary) and
XGLM (sinusoidal positions at offset 2, scaled embeddings).
Every check is two-sided max-abs with rtol 0 (docs/numerics.md#tolerances).
"""

from __future__ import annotations

import pytest
import torch

from tests.helpers import hf_block_outputs
from tests.tiny_models import CLASSIC_FAMILIES, CLASSIC_VOCAB, hf_layers, hooked_from, tiny_classic

ATOL = 1e-5


def tokens(batch=2, pos=12, seed=0):
    return torch.randint(3, CLASSIC_VOCAB, (batch, pos), generator=torch.Generator().manual_seed(seed))


def max_abs(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


def left_pad(seqs, pad_id=0):
    width = max(len(s) for s in seqs)
    toks = torch.full((len(seqs), width), pad_id)
    mask = torch.zeros(len(seqs), width, dtype=torch.long)
    for i, s in enumerate(seqs):
        toks[i, width - len(s) :], mask[i, width - len(s) :] = s, 1
    return toks, mask


@pytest.fixture(params=list(CLASSIC_FAMILIES), scope="module")
def pair(request):
    hf = tiny_classic(request.param, seed=len(request.param))
    return hf, hooked_from(hf)


def test_every_family_is_registered():
    from hooked import loading

    classes = {model_cls for _, model_cls, _ in CLASSIC_FAMILIES.values()}
    assert classes == {
        "GPTNeoXForCausalLM", "GPTJForCausalLM", "GPTNeoForCausalLM", "PhiForCausalLM", "OPTForCausalLM",
        "BloomForCausalLM", "StableLmForCausalLM", "GPTBigCodeForCausalLM", "Starcoder2ForCausalLM",
        "MptForCausalLM", "CodeGenForCausalLM", "XGLMForCausalLM",
    }  # fmt: skip
    assert classes <= set(loading.ARCHITECTURES)


# -- parity ----------------------------------------------------------------------------------


def test_logits_and_every_resid_post_match_hf(pair):
    hf, model = pair
    t = tokens()
    ref_blocks = hf_block_outputs(hf, hf_layers(hf), t)
    with torch.no_grad():
        ref = hf(t).logits
        logits, cache = model.run_with_cache(t, names_filter=lambda n: n.endswith("hook_resid_post"))
    assert logits.shape == ref.shape and max_abs(logits, ref) <= ATOL
    assert len(ref_blocks) == model.cfg.n_layers
    for layer, hidden in enumerate(ref_blocks):
        assert max_abs(cache["resid_post", layer], hidden) <= ATOL, f"layer {layer}"


def test_loss_matches_hf(pair):
    hf, model = pair
    t = tokens()
    with torch.no_grad():
        ref, ours = hf(t, labels=t).loss, model(t, return_type="loss")
    assert abs(ours.item() - ref.item()) <= ATOL


def test_processed_log_softmax_matches_unprocessed(pair):
    """Default processing (fold_ln, centering, value-bias folding) keeps log-probs
    (docs/numerics.md#weight-processing)."""
    from hooked import HookedTransformer

    hf, unprocessed = pair
    model = HookedTransformer.from_pretrained("processed", hf_model=hf)
    assert model.cfg.normalization_type == "LNPre"
    t = tokens()
    with torch.no_grad():
        ours, ref = model(t).log_softmax(-1), unprocessed(t).log_softmax(-1)
    assert max_abs(ours, ref) <= ATOL
    assert max_abs(ours, hf(t).logits.log_softmax(-1)) <= ATOL


@pytest.mark.parametrize("implementation", ["auto", "eager"])
def test_left_padded_rows_equal_each_prompt_alone(pair, implementation):
    _, model = pair
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


def test_sdpa_and_explicit_paths_agree(pair):
    _, model = pair
    t = tokens()
    with torch.no_grad():
        fast = model(t)
        model.cfg.attn_implementation = "eager"
        try:
            explicit = model(t)
        finally:
            model.cfg.attn_implementation = "auto"
    assert max_abs(fast, explicit) <= ATOL


def test_kv_cached_decoding_equals_full_forward(pair):
    from hooked.generation.kv_cache import HookedTransformerKeyValueCache

    _, model = pair
    toks, mask = left_pad([tokens(1, n, seed=n)[0] for n in (7, 12)])
    with torch.no_grad():
        full = model(toks, attention_mask=mask)
        cache, start = HookedTransformerKeyValueCache.init_cache(model.cfg, model.cfg.device, 2), 0
        for n in (5, 1, 6):
            chunk = slice(start, start + n)
            logits = model(toks[:, chunk], attention_mask=mask[:, chunk], past_kv_cache=cache)
            real = mask[:, chunk].bool()
            assert max_abs(logits[real], full[:, chunk][real]) <= ATOL, f"chunk at {start}"
            start += n


def test_greedy_20_tokens_match_hf_generate(pair):
    hf, model = pair
    prompt = tokens(1, 6, seed=7)
    with torch.no_grad():
        theirs = hf.generate(
            prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=20, do_sample=False,
            eos_token_id=None, pad_token_id=0,
        )  # fmt: skip
    ours = model.generate(prompt, max_new_tokens=20, do_sample=False, stop_at_eos=False, verbose=False)
    assert theirs.shape == (1, 26) and torch.equal(ours, theirs)


@pytest.mark.parametrize("name", ["bloom_6heads", "opt", "neox_parallel_rot025"])
def test_token_embeddings_as_input_match_hf_inputs_embeds(name):
    """Float input is the token embeddings (HF's `inputs_embeds`): Bloom's `embed.ln` still applies."""
    hf = tiny_classic(name, seed=3)
    model = hooked_from(hf)
    t = tokens()
    with torch.no_grad():
        embeds = hf.get_input_embeddings()(t)  # [batch, pos, d_model]
        assert max_abs(model(embeds), hf(inputs_embeds=embeds).logits) <= ATOL


def test_left_padded_batch_matches_hf_and_its_greedy_generate(pair):
    """HF given the same mask (and position ids cumsum(mask) - 1 where it takes them); then batched greedy decoding."""
    import inspect

    hf, model = pair
    toks, mask = left_pad([tokens(1, n, seed=n)[0] for n in (4, 9)])
    extra = {}
    if "position_ids" in inspect.signature(hf.forward).parameters:
        extra["position_ids"] = (mask.cumsum(-1) - 1).clamp(min=0)
    real = mask.bool()
    with torch.no_grad():
        ref = hf(toks, attention_mask=mask, **extra).logits
        assert max_abs(model(toks, attention_mask=mask)[real], ref[real]) <= ATOL
        theirs = hf.generate(
            toks, attention_mask=mask, max_new_tokens=12, do_sample=False, eos_token_id=None, pad_token_id=0
        )
    ours = model.generate(
        toks, attention_mask=mask, max_new_tokens=12, do_sample=False, stop_at_eos=False, verbose=False
    )
    assert torch.equal(ours, theirs)
