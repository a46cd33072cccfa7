"""LLaMA-shaped families (Llama, Mistral, Qwen2, Qwen3) against HuggingFace eager attention, float32.

Each config is a tiny random HF model whose weights, biases and norm gains are all drawn
at a scale where attention is far from uniform, so masks, rotary and grouping errors show
up in the logits. Every check is two-sided max-abs with rtol 0 (docs/numerics.md#tolerances).
"""

from __future__ import annotations

import pytest
import torch

from tests.helpers import hf_block_outputs
from tests.tiny_models import NO_PROCESSING, VOCAB, hooked_from, tiny_llama_family

ATOL = 1e-5

LLAMA3_ROPE = dict(
    rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=128
)

# name -> (HF family, config overrides). Dimensions: d <= 64, L = 2.
CONFIGS = {
    # GQA ratio 1 (plain MHA), untied, every bias Llama can have (q/k/v/o and MLP).
    "llama_mha_biases": (
        "llama",
        dict(num_attention_heads=4, num_key_value_heads=4, attention_bias=True, mlp_bias=True),
    ),
    # GQA ratio 2, tied embeddings.
    "llama_gqa2_tied": ("llama", dict(num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)),
    # GQA ratio 4 with Llama 3.1 NTK-by-parts scaling (original context 128: all three frequency bands occur).
    "llama_gqa4_llama3_rope": (
        "llama",
        dict(
            hidden_size=64,
            num_attention_heads=8,
            num_key_value_heads=2,
            max_position_embeddings=256,
            rope_parameters=LLAMA3_ROPE,
        ),
    ),
    # Multi-query attention, linear rope scaling, explicit head_dim != d_model / n_heads, rope_theta 5e5.
    "llama_mqa_linear_rope_head_dim": (
        "llama",
        dict(
            num_attention_heads=4,
            num_key_value_heads=1,
            head_dim=16,
            rope_parameters=dict(rope_type="linear", factor=2.0, rope_theta=5e5),
        ),
    ),
    # HF's default rope for these classes rotates the whole head even if partial_rotary_factor is set.
    "llama_partial_rotary_factor_ignored_by_hf": (
        "llama",
        dict(
            num_attention_heads=4,
            num_key_value_heads=2,
            rope_parameters=dict(rope_theta=1e4, partial_rotary_factor=0.5),
        ),
    ),
    # Sliding window (4) shorter than the sequence (12), on every layer; GQA ratio 2.
    "mistral_window4": ("mistral", dict(num_attention_heads=4, num_key_value_heads=2, sliding_window=4)),
    # q/k/v biases (always on in Qwen2), tied, sliding window on layer 1 only (max_window_layers=1).
    "qwen2_biases_window_layer1": (
        "qwen2",
        dict(
            num_attention_heads=4,
            num_key_value_heads=2,
            tie_word_embeddings=True,
            use_sliding_window=True,
            sliding_window=4,
            max_window_layers=1,
        ),
    ),
    # Per-head qk-norm, explicit head_dim 16 (4 heads x 16 != 32), MQA.
    "qwen3_qk_norm_mqa": ("qwen3", dict(num_attention_heads=4, num_key_value_heads=1, head_dim=16)),
    # qk-norm plus Qwen3's optional attention_bias (q/k/v/o).
    "qwen3_qk_norm_bias_gqa2": (
        "qwen3",
        dict(num_attention_heads=4, num_key_value_heads=2, head_dim=8, attention_bias=True),
    ),
}

GQA_CONFIGS = [name for name, (_, o) in CONFIGS.items() if o["num_key_value_heads"] < o["num_attention_heads"]]


def tokens(batch=2, pos=12, seed=0):
    return torch.randint(0, VOCAB, (batch, pos), generator=torch.Generator().manual_seed(seed))


def max_abs(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


@pytest.fixture(params=list(CONFIGS), scope="module")
def pair(request):
    family, overrides = CONFIGS[request.param]
    hf = tiny_llama_family(family, seed=len(request.param), **overrides)
    return hf, hooked_from(hf)


@pytest.fixture(params=GQA_CONFIGS, scope="module")
def gqa_pair(request):
    family, overrides = CONFIGS[request.param]
    hf = tiny_llama_family(family, seed=len(request.param), **overrides)
    return hf, hooked_from(hf)


# -- parity ------------------------------------------------------------------------------


def test_logits_match_hf(pair):
    hf, model = pair
    t = tokens()
    with torch.no_grad():
        ref, ours = hf(t).logits, model(t)
    assert ours.shape == ref.shape
    assert max_abs(ours, ref) <= ATOL


def test_every_resid_post_matches_hf_decoder_layer(pair):
    hf, model = pair
    t = tokens()
    ref = hf_block_outputs(hf, hf.model.layers, t)
    with torch.no_grad():
        _, cache = model.run_with_cache(t, names_filter=lambda n: n.endswith("hook_resid_post"))
    assert len(ref) == model.cfg.n_layers
    for layer, hidden in enumerate(ref):
        assert max_abs(cache["resid_post", layer], hidden) <= ATOL, f"layer {layer}"


def test_loss_matches_hf(pair):
    hf, model = pair
    t = tokens()
    with torch.no_grad():
        ref, ours = hf(t, labels=t).loss, model(t, return_type="loss")
    assert abs(ours.item() - ref.item()) <= ATOL


def test_processed_log_softmax_matches_hf(pair):
    """Default `from_pretrained` processing (fold_ln, centering, value-bias folding) keeps log-probs
    (docs/numerics.md#tolerances)."""
    from hooked import HookedTransformer

    hf, _ = pair
    model = HookedTransformer.from_pretrained("processed", hf_model=hf)
    t = tokens()
    with torch.no_grad():
        ref, ours = hf(t).logits.log_softmax(-1), model(t).log_softmax(-1)
    assert max_abs(ours, ref) <= ATOL


# -- conversion facts --------------------------------------------------------------------


def test_tied_embeddings_share_storage(pair):
    hf, model = pair
    tied = hf.config.tie_word_embeddings
    assert model.embeddings_tied() == tied
    if tied:
        assert model.unembed.W_U.data_ptr() == model.embed.W_E.data_ptr()
        assert torch.equal(model.unembed.W_U, model.embed.W_E.T)


def test_converted_config_fields(pair):
    hf, model = pair
    cfg, c = model.cfg, hf.config
    assert (cfg.normalization_type, cfg.positional_embedding_type) == ("RMS", "rotary")
    assert (cfg.act_fn, cfg.gated_mlp) == ("silu", True)
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    assert cfg.d_head == head_dim and cfg.rotary_dim == head_dim and not cfg.rotary_adjacent_pairs
    assert cfg.n_kv_heads == c.num_key_value_heads and cfg.eps == c.rms_norm_eps
    assert cfg.n_ctx == c.max_position_embeddings
    assert cfg.rotary_base == c.rope_parameters["rope_theta"]
    assert cfg.default_prepend_bos == (type(hf).__name__ in ("LlamaForCausalLM", "MistralForCausalLM"))
    assert cfg.use_qk_norm == (type(hf).__name__ == "Qwen3ForCausalLM")


def test_sliding_window_is_applied_by_hf_and_by_us():
    """Guard against a vacuous window test: without the window HF's logits change a lot."""
    family, overrides = CONFIGS["mistral_window4"]
    windowed = tiny_llama_family(family, seed=1, **overrides)
    full = tiny_llama_family(family, seed=1, **dict(overrides, sliding_window=None))
    model = hooked_from(windowed)
    assert model.cfg.use_local_attn and model.cfg.window_size == 4 and model.cfg.attn_types == ["local", "local"]
    t = tokens()
    with torch.no_grad():
        gap = max_abs(windowed(t).logits, full(t).logits)
        assert gap > 1e-2
        assert max_abs(model(t), windowed(t).logits) <= ATOL
        _, cache = model.run_with_cache(t, names_filter="blocks.0.attn.hook_pattern")
    pattern = cache["pattern", 0]  # [batch, head, query, key]
    i, j = torch.meshgrid(torch.arange(12), torch.arange(12), indexing="ij")
    assert (pattern[..., (j <= i - 4) | (j > i)] == 0).all()


# -- grouped-query attention -------------------------------------------------------------


def test_kv_hooks_at_kv_heads_by_default_and_at_n_heads_ungrouped(gqa_pair):
    _, model = gqa_pair
    cfg, t = model.cfg, tokens()
    names = lambda n: n.endswith(("attn.hook_k", "attn.hook_v", "attn.hook_rot_k"))  # noqa: E731
    with torch.no_grad():
        grouped, cache = model.run_with_cache(t, names_filter=names)
        for name in ("k", "v", "rot_k"):
            assert cache[name, 0].shape == (2, 12, cfg.n_key_value_heads, cfg.d_head)
        model.set_ungroup_grouped_query_attention(True)
        try:
            ungrouped, cache = model.run_with_cache(t, names_filter=names)
        finally:
            model.set_ungroup_grouped_query_attention(False)
    for name in ("k", "v", "rot_k"):
        assert cache[name, 0].shape == (2, 12, cfg.n_heads, cfg.d_head)
    assert max_abs(grouped, ungrouped) <= ATOL


def test_gqa_weights_stored_at_kv_heads(gqa_pair):
    _, model = gqa_pair
    attn, cfg = model.blocks[0].attn, model.cfg
    assert attn._W_K.shape == (cfg.n_key_value_heads, cfg.d_model, cfg.d_head)
    assert attn.W_K.shape == (cfg.n_heads, cfg.d_model, cfg.d_head)
    assert "blocks.0.attn._W_K" in model.state_dict() and "blocks.0.attn.W_K" not in model.state_dict()


# -- attention paths and padding ---------------------------------------------------------

PATH_CONFIGS = ["mistral_window4", "qwen2_biases_window_layer1", "llama_gqa4_llama3_rope"]


@pytest.mark.parametrize("name", PATH_CONFIGS)
def test_sdpa_and_explicit_paths_agree(name):
    family, overrides = CONFIGS[name]
    model = hooked_from(tiny_llama_family(family, seed=3, **overrides))
    t = tokens()
    with torch.no_grad():
        fast = model(t)  # nothing observes a pattern: every layer takes SDPA
        model.cfg.attn_implementation = "eager"
        try:
            explicit = model(t)
        finally:
            model.cfg.attn_implementation = "auto"
    assert max_abs(fast, explicit) <= ATOL


def _left_pad(seqs, pad_id=0):
    width = max(len(s) for s in seqs)
    toks = torch.full((len(seqs), width), pad_id)
    mask = torch.zeros(len(seqs), width, dtype=torch.long)
    for i, s in enumerate(seqs):
        toks[i, width - len(s) :], mask[i, width - len(s) :] = s, 1
    return toks, mask


@pytest.mark.parametrize("implementation", ["auto", "eager"])
@pytest.mark.parametrize("name", PATH_CONFIGS)
def test_left_padded_batch_equals_each_prompt_alone(name, implementation):
    family, overrides = CONFIGS[name]
    model = hooked_from(tiny_llama_family(family, seed=4, **overrides))
    seqs = [tokens(1, n, seed=n)[0] for n in (5, 12, 9)]
    toks, mask = _left_pad(seqs)
    model.cfg.attn_implementation = implementation
    try:
        with torch.no_grad():
            batched = model(toks, attention_mask=mask)
            for i, s in enumerate(seqs):
                alone = model(s[None])[0]
                assert max_abs(batched[i, -len(s) :], alone) <= ATOL, f"row {i}"
    finally:
        model.cfg.attn_implementation = "auto"


def test_left_padded_batch_matches_hf_with_position_ids():
    """The padded batch also equals HF given the same mask and position ids (cumsum(mask) - 1)."""
    family, overrides = CONFIGS["mistral_window4"]
    hf = tiny_llama_family(family, seed=5, **overrides)
    model = hooked_from(hf)
    toks, mask = _left_pad([tokens(1, n, seed=n)[0] for n in (5, 12)])
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        ref = hf(toks, attention_mask=mask, position_ids=positions).logits
        ours = model(toks, attention_mask=mask)
    real = mask.bool()
    assert max_abs(ours[real], ref[real]) <= ATOL


@pytest.mark.parametrize("name", ["llama_gqa2_tied", "qwen3_qk_norm_mqa"])
def test_loads_from_a_saved_safetensors_checkpoint(name, tmp_path):
    """The lazy path (no `hf_model`): `save_pretrained` drops a tied `lm_head`, which must come back tied."""
    from hooked import HookedTransformer

    family, overrides = CONFIGS[name]
    hf = tiny_llama_family(family, seed=6, **overrides)
    hf.save_pretrained(tmp_path, safe_serialization=True)
    model = HookedTransformer.from_pretrained(str(tmp_path), **NO_PROCESSING)
    assert model.embeddings_tied() == hf.config.tie_word_embeddings
    t = tokens()
    with torch.no_grad():
        assert max_abs(model(t), hf(t).logits) <= ATOL
