"""Gemma 4 (and its image-text model's text tower) and Gemma 3n against HuggingFace eager attention, float32.

Tiny random HF models (`tests/tiny_models.GEMMA_PLE_CONFIGS`), every parameter redrawn, with what
is new switched on and visible: 4 layers alternating sliding (window 4 < 12 positions) and global,
the last two attending to the first two's keys and values (Gemma 3n: 3 layers, the last reusing
layer 0's); per-layer inputs; Gemma 4's global
layers twice as wide with proportional rotary, its `layer_scalar`s away from 1, and (second case)
one K/V head whose values are its keys' projection and double-wide MLPs on the sharing layers;
Gemma 3n's AltUp (4 streams), LAuReL, sparse gates (0.75, 0.5) on two layers, per-layer MLP widths and a
per-layer table shorter than the vocabulary. Every check is two-sided max-abs with rtol 0
(docs/numerics.md#tolerances).
"""

from __future__ import annotations

import pytest
import torch

from tests.helpers import hf_block_outputs
from tests.tiny_models import GEMMA_PLE_CONFIGS, VOCAB, hooked_from, tiny_gemma_ple

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


def decoder_layers(hf):
    inner = hf.model.language_model if hasattr(hf.model, "language_model") else hf.model
    return inner.layers


@pytest.fixture(params=list(GEMMA_PLE_CONFIGS), scope="module")
def pair(request):
    hf = tiny_gemma_ple(request.param, seed=len(request.param))
    return request.param, hf, hooked_from(hf)


def test_logits_and_every_resid_post_match_hf(pair):
    """Gemma 3n layers return AltUp streams: HF's `[stream, batch, pos, d]`, hooked's `[batch, pos, stream, d]`."""
    _, hf, model = pair
    t = tokens()
    ref_blocks = hf_block_outputs(hf, decoder_layers(hf), t)
    with torch.no_grad():
        ref = hf(t).logits
        logits, cache = model.run_with_cache(t, names_filter=lambda n: n.endswith("hook_resid_post"))
    assert logits.shape == ref.shape and max_abs(logits, ref) <= ATOL
    assert len(ref_blocks) == model.cfg.n_layers
    for layer, hidden in enumerate(ref_blocks):
        hidden = hidden.permute(1, 2, 0, 3) if hidden.ndim == 4 else hidden
        assert max_abs(cache["resid_post", layer], hidden) <= ATOL, f"layer {layer}"


def test_explicit_attention_path_equals_hf_bit_for_bit(pair):
    """With the explicit softmax (HF eager's op order) every block output and the logits are HF's exactly; the
    default SDPA path above differs only by float32 rounding in another order."""
    _, hf, model = pair
    t = tokens()
    ref_blocks = hf_block_outputs(hf, decoder_layers(hf), t)
    model.cfg.attn_implementation = "eager"
    try:
        with torch.no_grad():
            ref = hf(t).logits
            logits, cache = model.run_with_cache(t, names_filter=lambda n: n.endswith("hook_resid_post"))
    finally:
        model.cfg.attn_implementation = "auto"
    assert torch.equal(logits, ref)
    for layer, hidden in enumerate(ref_blocks):
        assert torch.equal(cache["resid_post", layer], hidden.permute(1, 2, 0, 3) if hidden.ndim == 4 else hidden)


def test_processed_log_softmax_matches_unprocessed_and_hf(pair):
    """Default processing: `fold_ln` for Gemma 4 (Gemma 3n's LAuReL keeps ln1, so it is skipped there)."""
    from hooked import HookedTransformer

    name, hf, unprocessed = pair
    model = HookedTransformer.from_pretrained("processed", hf_model=hf)
    assert ("fold_ln" in model.cfg.weight_processing) == name.startswith("gemma4")
    t = tokens()
    with torch.no_grad():
        ours = model(t).log_softmax(-1)
        assert max_abs(ours, unprocessed(t).log_softmax(-1)) <= ATOL
        assert max_abs(ours, hf(t).logits.log_softmax(-1)) <= ATOL


def test_greedy_20_tokens_match_hf_generate(pair):
    _, hf, model = pair
    prompt = tokens(1, 6, seed=7)
    with torch.no_grad():
        theirs = hf.generate(
            prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=20, do_sample=False,
            eos_token_id=None, pad_token_id=0,
        )  # fmt: skip
    ours = model.generate(prompt, max_new_tokens=20, do_sample=False, stop_at_eos=False, verbose=False)
    assert theirs.shape == (1, 26) and torch.equal(ours, theirs)


def test_kv_cached_decoding_equals_full_forward(pair):
    """The sharing layers read the lending layers' keys and values, cached positions included."""
    from hooked.generation.kv_cache import HookedTransformerKeyValueCache

    _, _, model = pair
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
    lengths = [entry.length for entry in cache.entries]
    assert lengths == [0 if source is not None else 12 for source in model.cfg.kv_shared_from]  # sharers cache nothing


@pytest.mark.parametrize("implementation", ["auto", "eager"])
def test_left_padded_rows_equal_each_prompt_alone(pair, implementation):
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


def test_sharing_layers_attend_to_the_lending_layers_keys(pair):
    """Layer 2 (sliding) reuses layer 0's keys, layer 3 (global) layer 1's (Gemma 3n: layer 2 alone): its pattern is
    softmax of its own rotated queries against the lender's rotated keys; it has no K/V weights or hooks of its own."""
    _, _, model = pair
    assert model.cfg.kv_shared_from == [None, None, 0, 1][: model.cfg.n_layers]
    assert "blocks.2.attn.hook_k" not in model.hook_dict and not hasattr(model.blocks[2].attn, "_W_K")
    t = tokens(1, 12)
    with torch.no_grad():
        _, cache = model.run_with_cache(t)
    shared = [(layer, lender) for layer, lender in enumerate(model.cfg.kv_shared_from) if lender is not None]
    for layer, lender in shared:
        attn = model.blocks[layer].attn
        q, k = cache["rot_q", layer][0], cache["rot_k", lender][0]  # [pos, head, d_head], [pos, kv_head, d_head]
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        scores = torch.einsum("qhd,khd->hqk", q, k) * attn.scale
        allowed = cache["pattern", layer][0] > 0
        assert torch.equal(allowed.any(-1), torch.ones_like(allowed.any(-1)))
        window = model.cfg.window_size if attn.window else 12
        causal = torch.ones(12, 12).tril().bool() & ~torch.ones(12, 12).tril(-window).bool()
        pattern = scores.masked_fill(~causal, float("-inf")).softmax(-1)
        assert max_abs(pattern, cache["pattern", layer][0]) <= ATOL


def test_per_layer_inputs_hooks_and_their_effect(pair):
    _, _, model = pair
    t = tokens(2, 12)
    d_ple = model.cfg.d_per_layer_input
    with torch.no_grad():
        logits, cache = model.run_with_cache(t)
        zeroed = model.run_with_hooks(
            t, fwd_hooks=[("per_layer_embed.hook_per_layer_inputs", lambda x, hook: torch.zeros_like(x))]
        )
    assert cache["per_layer_embed.hook_per_layer_inputs"].shape == (2, 12, model.cfg.n_layers, d_ple)
    assert cache["blocks.1.per_layer.hook_input"].shape == (2, 12, d_ple)
    assert torch.equal(cache["blocks.1.per_layer.hook_input"], cache["per_layer_embed.hook_per_layer_inputs"][:, :, 1])
    assert cache["blocks.1.per_layer.hook_out"].shape == (2, 12, model.cfg.d_model)
    assert max_abs(logits, zeroed) > 1e-3


def test_gemma4_global_layers_are_wider_with_proportional_rotary():
    """Layer 1 (global): 16-wide heads whose first 2 of 8 frequency pairs rotate (pairs (i, i + 8)); the rest pass."""
    model = hooked_from(tiny_gemma_ple("gemma4_kv_shared_ple", seed=1))
    t = tokens(1, 12)
    with torch.no_grad():
        _, cache = model.run_with_cache(t)
    assert cache["q", 0].shape[-1] == 8 and cache["q", 1].shape[-1] == 16
    normed = cache["blocks.1.attn.q_norm.hook_normalized"] * model.blocks[1].attn.q_norm.w  # the q rotary reads
    rotated = cache["rot_q", 1]
    still = [d for d in range(16) if d % 8 >= 2]
    assert torch.equal(rotated[..., still], normed[..., still])
    assert max_abs(rotated[:, 1:, :, [0, 1, 8, 9]], normed[:, 1:, :, [0, 1, 8, 9]]) > 1e-2


def test_gemma4_layer_scalar_scales_the_whole_stream():
    model = hooked_from(tiny_gemma_ple("gemma4_kv_shared_ple", seed=1))
    t = tokens(1, 12)
    with torch.no_grad():
        _, cache = model.run_with_cache(t)
    block = model.blocks[0]
    assert block.layer_scalar.item() != 1.0
    unscaled = cache["resid_mid", 0] + cache["mlp_out", 0] + cache["blocks.0.per_layer.hook_out"]
    assert max_abs(cache["resid_post", 0], unscaled * block.layer_scalar) <= ATOL


def test_gemma3n_altup_streams_and_sparse_gates():
    model = hooked_from(tiny_gemma_ple("gemma3n_altup_laurel_sparse", seed=1))
    t = tokens(2, 12)
    with torch.no_grad():
        _, cache = model.run_with_cache(t)
    assert cache["resid_pre", 0].shape == (2, 12, 4, 32) and cache["resid_post", 2].shape == (2, 12, 4, 32)
    assert cache["attn_out", 0].shape == cache["resid_mid", 0].shape == (2, 12, 32)
    assert cache["blocks.0.altup.hook_modalities"].shape == (2, 12, 4)
    assert cache["blocks.0.laurel.hook_left"].shape == (2, 12, 4)
    zeros = [(cache[f"blocks.{layer}.mlp.hook_sparse_gate"] == 0).float().mean().item() for layer in (0, 1)]
    assert 0.6 < zeros[0] < 0.9 and 0.3 < zeros[1] < 0.7  # sparsity 0.75 and 0.5 of a roughly normal gate
    assert "blocks.2.mlp.hook_sparse_gate" not in model.hook_dict  # a dense layer
    assert model.blocks[1].mlp.W_in.shape == (32, 48)  # per-layer intermediate sizes


def test_stacked_views_refuse_what_varies_by_layer():
    model = hooked_from(tiny_gemma_ple("gemma4_kv_shared_ple", seed=1))
    with pytest.raises(NotImplementedError, match="kv_shared_from"):
        model.W_K  # noqa: B018
    with pytest.raises(NotImplementedError, match="d_head differ"):
        model.W_Q  # noqa: B018
    assert model.blocks[1].attn.W_Q.shape == (4, 32, 16)


@pytest.mark.parametrize(
    ("name", "method", "message"),
    [
        ("gemma4_kv_shared_ple", "decompose_resid", "not the sum"),
        ("gemma4_kv_shared_ple", "get_full_resid_decomposition", "not the sum"),
        ("gemma3n_altup_laurel_sparse", "accumulated_resid", "AltUp streams"),
        ("gemma3n_altup_laurel_sparse", "logit_lens", "AltUp streams"),
    ],
)
def test_decompositions_that_do_not_hold_are_refused(name, method, message):
    """The residual stream of Gemma 3n/4 is no sum of embedding and sublayer outputs (Gemma 3n: several streams)."""
    model = hooked_from(tiny_gemma_ple(name, seed=1))
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens(1, 6))
    with pytest.raises(NotImplementedError, match=message):
        getattr(cache, method)()
    if name.startswith("gemma4"):  # the stream itself is one: the logit lens reads it
        lens = cache.logit_lens()
        assert max_abs(lens[-1], model(tokens(1, 6))) <= ATOL
