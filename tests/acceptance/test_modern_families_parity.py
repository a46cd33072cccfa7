"""Modern families and rope scalings against HuggingFace eager attention, float32 (bounds: docs/numerics.md#tolerances).

Each case is a tiny random HF model with its special feature switched on, run on a
sequence long enough for that feature to matter:

- Llama with `yarn` (positions past `original_max_position_embeddings`) and with
  `dynamic` NTK (a sequence longer than `max_position_embeddings`, so the base grows);
- Phi-3 (fused qkv/gate_up, partial rotary, sliding window) with `longrope` on a
  sequence shorter than `original_max_position_embeddings` (short factors) and on one
  longer (long factors);
- SmolLM3 with NoPE layers;
- OLMo-1 (parameter-free LayerNorm, `clip_qkv` that clips), OLMo-2 (post-sublayer
  RMSNorms, qk-norm over the full projection), OLMo-3 (as OLMo-2, plus sliding layers
  and per-layer-type rope with YaRN on the full-attention layers);
- HunYuan (qk RMSNorm after rotary), and its `dynamic` rope with a fixed `alpha` (a static base);
- Granite with every multiplier != 1 (tied embeddings, untied by the folds), Cohere
  (parallel block, bias-free LayerNorm, adjacent-pair rotary, per-head qk LayerNorm,
  `logit_scale` != 1);
- Falcon: new-architecture GQA (grouped fused QKV) with two norms and with one, the
  multi-query variant, a sequential multi-head one, and ALiBi (falcon-rw), compared
  with HF's SDPA path because HF's eager Falcon-ALiBi adds the bias twice.

HF's dynamic rope is stateful (it keeps the frequencies of the longest sequence seen
until a sequence shorter than the original length resets them); hooked's depend only
on the current call, which equals a fresh HF model and every growing generation.
"""

from __future__ import annotations

import pytest
import torch

from tests.helpers import hf_block_outputs, max_abs
from tests.tiny_models import hooked_from, tiny_hf, tokens

ATOL = 1e-5

LONGROPE = dict(
    rope_type="longrope",
    rope_theta=1e4,
    partial_rotary_factor=0.5,
    short_factor=[1.0, 1.3, 2.0, 3.0],
    long_factor=[2.0, 3.0, 5.0, 9.0],
)
PHI3 = dict(num_attention_heads=2, num_key_value_heads=1, original_max_position_embeddings=16, rope_parameters=LONGROPE)

# name -> (HF class prefix, config overrides, sequence length)
CASES = {
    "llama_yarn": (
        "Llama",
        dict(
            num_key_value_heads=2,
            rope_parameters=dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=16),
        ),
        40,
    ),
    "llama_yarn_mscale": (
        "Llama",
        dict(
            num_key_value_heads=2,
            max_position_embeddings=64,
            rope_parameters=dict(
                rope_type="yarn",
                factor=4.0,
                original_max_position_embeddings=16,
                mscale=1.0,
                mscale_all_dim=0.5,
                beta_fast=16,
                beta_slow=2,
            ),
        ),
        40,
    ),
    "llama_dynamic_beyond_max": (
        "Llama",
        dict(num_key_value_heads=2, max_position_embeddings=32, rope_parameters=dict(rope_type="dynamic", factor=2.0)),
        48,
    ),
    "phi3_longrope_short": ("Phi3", dict(PHI3, sliding_window=6), 12),
    "phi3_longrope_long": ("Phi3", PHI3, 40),
    "smollm3_nope": ("SmolLM3", dict(num_key_value_heads=2, num_hidden_layers=4, no_rope_layer_interval=2), 16),
    "olmo_clip_qkv": ("Olmo", dict(num_key_value_heads=2, clip_qkv=0.5), 16),
    "olmo2_post_norm_full_qk_norm": ("Olmo2", dict(num_key_value_heads=2), 16),
    "olmo3_sliding_per_type_rope": (
        "Olmo3",
        dict(
            num_key_value_heads=2,
            num_hidden_layers=4,
            sliding_window=4,
            rope_parameters=dict(
                sliding_attention=dict(rope_type="default", rope_theta=1e4),
                full_attention=dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=8, rope_theta=5e5),
            ),
        ),
        24,
    ),
    "granite_multipliers": (
        "Granite",
        dict(
            num_key_value_heads=2,
            tie_word_embeddings=True,
            embedding_multiplier=3.0,
            attention_multiplier=0.3,
            residual_multiplier=0.5,
            logits_scaling=4.0,
        ),
        16,
    ),
    "cohere_qk_norm_logit_scale": ("Cohere", dict(num_key_value_heads=2, use_qk_norm=True, logit_scale=0.5), 16),
    "cohere_tied_logit_scale": ("Cohere", dict(num_key_value_heads=2, logit_scale=2.0), 16),
    "falcon_new_arch_gqa_two_ln": ("Falcon", dict(new_decoder_architecture=True, num_kv_heads=2, bias=True), 16),
    "falcon_new_arch_one_ln": (
        "Falcon",
        dict(new_decoder_architecture=True, num_kv_heads=2, num_ln_in_parallel_attn=1),
        16,
    ),
    "falcon_multi_query": ("Falcon", dict(multi_query=True, parallel_attn=True, bias=True), 16),
    "falcon_mha_sequential": ("Falcon", dict(multi_query=False, parallel_attn=False, bias=True), 16),
    # HunYuan: the per-head qk RMSNorm after rotary; its `dynamic` rope with a fixed alpha (a static base)
    "hunyuan_qk_norm_after_rotary": ("HunYuanDenseV1", dict(num_key_value_heads=2, head_dim=8), 16),
    "hunyuan_ntk_alpha": (
        "HunYuanDenseV1",
        dict(
            num_key_value_heads=2,
            head_dim=8,
            rope_parameters=dict(rope_type="dynamic", alpha=50.0, factor=1.0, rope_theta=1e4),
        ),
        16,
    ),
    # HF's eager Falcon-ALiBi adds the bias twice (in the mask and in the scores); SDPA, HF's default, once.
    "falcon_rw_alibi_vs_hf_sdpa": (
        "Falcon",
        dict(alibi=True, multi_query=False, parallel_attn=False, bias=True, attn_implementation="sdpa"),
        16,
    ),
}
# Without a rope scaling (or with every layer rotating), these cases compute something else.
UNSCALED = {
    "llama_yarn": dict(rope_parameters=dict(rope_type="default")),
    "llama_yarn_mscale": dict(rope_parameters=dict(rope_type="default")),
    "llama_dynamic_beyond_max": dict(rope_parameters=dict(rope_type="default")),
    "phi3_longrope_short": dict(rope_parameters=dict(rope_type="default", partial_rotary_factor=0.5)),
    "phi3_longrope_long": dict(rope_parameters=dict(rope_type="default", partial_rotary_factor=0.5)),
    "smollm3_nope": dict(no_rope_layers=[1, 1, 1, 1]),
    "olmo_clip_qkv": dict(clip_qkv=None),
    "olmo3_sliding_per_type_rope": dict(sliding_window=None, rope_parameters=dict(rope_type="default", rope_theta=5e5)),
    "granite_multipliers": dict(
        embedding_multiplier=1.0, attention_multiplier=0.25, residual_multiplier=1.0, logits_scaling=1.0
    ),
    "cohere_qk_norm_logit_scale": dict(use_qk_norm=False, logit_scale=1.0),
    "hunyuan_ntk_alpha": dict(rope_parameters=dict(rope_type="default", rope_theta=1e4)),
}
# Cached decoding equals the full forward unless the frequencies change with the length mid-sequence.
CACHE_EXACT = [name for name in CASES if name not in ("llama_dynamic_beyond_max", "phi3_longrope_long")]


def build(name: str, seed: int | None = None, **extra):
    prefix, overrides, _ = CASES[name]
    return tiny_hf(prefix, seed=len(name) if seed is None else seed, **dict(overrides, **extra))


@pytest.fixture(params=list(CASES), scope="module")
def case(request):
    hf = build(request.param)
    return request.param, hf, hooked_from(hf)


def test_logits_and_every_resid_post_match_hf(case):
    name, hf, model = case
    t = tokens(2, CASES[name][2])
    ref = hf_block_outputs(hf, hf.model.layers if hasattr(hf, "model") else hf.transformer.h, t)
    with torch.no_grad():
        logits, cache = model.run_with_cache(t, names_filter=lambda n: n.endswith("hook_resid_post"))
        assert max_abs(logits, hf(t).logits) <= ATOL
    for layer, hidden in enumerate(ref):
        assert max_abs(cache["resid_post", layer], hidden) <= ATOL, f"layer {layer}"


@pytest.mark.parametrize("name", list(UNSCALED))
def test_the_special_feature_changes_the_output(name):
    """Guard against vacuous parity: the same weights without the feature give other logits."""
    model = hooked_from(build(name))
    plain = hooked_from(build(name, **UNSCALED[name]))
    t = tokens(2, CASES[name][2])
    with torch.no_grad():
        assert max_abs(model(t), plain(t)) > 1e-3


def test_processed_matches_hf(case):
    from hooked import HookedTransformer

    name, hf, unprocessed = case
    model = HookedTransformer.from_pretrained("processed", hf_model=hf)
    t = tokens(2, CASES[name][2])
    with torch.no_grad():
        ours = model(t).log_softmax(-1)
        assert max_abs(ours, hf(t).logits.log_softmax(-1)) <= ATOL
        assert max_abs(ours, unprocessed(t).log_softmax(-1)) <= ATOL


@pytest.mark.parametrize("name", CACHE_EXACT)
def test_kv_cached_decoding_equals_full_forward(name):
    from hooked.generation.kv_cache import HookedTransformerKeyValueCache

    model = hooked_from(build(name))
    n = CASES[name][2]
    t = tokens(2, n)
    splits = [n // 2, 1, n - n // 2 - 1]
    with torch.no_grad():
        full = model(t)
        cache, start = HookedTransformerKeyValueCache.init_cache(model.cfg, model.cfg.device, 2), 0
        for size in splits:
            assert (
                max_abs(model(t[:, start : start + size], past_kv_cache=cache), full[:, start : start + size]) <= ATOL
            )
            start += size


def test_greedy_20_tokens_match_hf(case):
    """Generation crosses the length thresholds (dynamic: 32, longrope: 16) while decoding."""
    name, hf, model = case
    t = tokens(1, 14, seed=3)
    with torch.no_grad():
        ref = hf.generate(t, attention_mask=torch.ones_like(t), max_new_tokens=20, do_sample=False, eos_token_id=None)
    ours = model.generate(t, max_new_tokens=20, do_sample=False, stop_at_eos=False, verbose=False)
    assert torch.equal(ours, ref)


def test_longrope_switches_factors_on_total_length():
    """One model: a 16-token sequence uses the short factors, a 17-token one the long ones (HF's rule)."""
    from hooked.components.rotary import rotary_inv_freq

    model = hooked_from(build("phi3_longrope_long"))
    cfg = model.cfg
    short = rotary_inv_freq(cfg.rotary_dim, cfg.rotary_base, cfg.rotary_scaling, seq_len=16)
    long = rotary_inv_freq(cfg.rotary_dim, cfg.rotary_base, cfg.rotary_scaling, seq_len=17)
    exponents = torch.arange(0, 8, 2).float() / 8
    assert torch.equal(short, 1.0 / (torch.tensor(LONGROPE["short_factor"]) * 1e4**exponents))
    assert torch.equal(long, 1.0 / (torch.tensor(LONGROPE["long_factor"]) * 1e4**exponents))


def test_nope_layers_have_no_rotary_hooks():
    model = hooked_from(build("smollm3_nope"))
    assert model.cfg.nope_layers == [1, 3]
    rotary_hooks = {name for name in model.hook_dict if name.endswith("hook_rot_q")}
    assert rotary_hooks == {"blocks.0.attn.hook_rot_q", "blocks.2.attn.hook_rot_q"}


def test_phi3_fused_projections_split_as_views():
    hf = build("phi3_longrope_short")
    model = hooked_from(hf)
    a, d_head = hf.model.layers[0].self_attn.qkv_proj.weight, model.cfg.d_head
    assert torch.equal(model.blocks[0].attn.W_Q[1], a[d_head : 2 * d_head].T)
    assert torch.equal(model.blocks[0].attn._W_K[0], a[2 * d_head : 3 * d_head].T)
    gate_up = hf.model.layers[0].mlp.gate_up_proj.weight
    assert torch.equal(model.blocks[0].mlp.W_gate, gate_up[: model.cfg.d_mlp].T)


def test_olmo2_norms_follow_the_sublayers_and_are_not_folded():
    from hooked import HookedTransformer

    hf = build("olmo2_post_norm_full_qk_norm")
    model = HookedTransformer.from_pretrained("olmo2", hf_model=hf)  # default processing: fold_ln is skipped
    assert "fold_ln" not in model.cfg.weight_processing and "blocks.0.ln1.w" in model.state_dict()
    order = []
    hooks = [
        (name, lambda x, hook: order.append(hook.name))
        for name in ("blocks.0.attn.hook_z", "blocks.0.ln1.hook_normalized")
    ]
    t = tokens(2, 8)
    with torch.no_grad():
        _, cache = model.run_with_cache(t, names_filter=lambda n: n.startswith("blocks.0."))
        model.run_with_hooks(t, fwd_hooks=hooks)
    assert order == ["blocks.0.attn.hook_z", "blocks.0.ln1.hook_normalized"]
    H, dh = model.cfg.n_heads, model.cfg.d_head
    assert cache["blocks.0.attn.q_norm.hook_normalized"].shape == (2, 8, H * dh)
    assert cache["blocks.0.attn.q_norm.hook_scale"].shape == (2, 8, 1)
    attn_out = cache["blocks.0.hook_attn_out"]
    assert max_abs(attn_out, cache["blocks.0.ln1.hook_normalized"] * model.blocks[0].ln1.w) <= ATOL


def test_granite_and_cohere_fold_their_multipliers_into_weights():
    granite = hooked_from(build("granite_multipliers"))
    hf = build("granite_multipliers")
    assert torch.equal(granite.embed.W_E, hf.model.embed_tokens.weight * 3.0)
    assert not granite.embeddings_tied()  # W_E x 3 and W_U / 4 separate the tied matrix
    assert max_abs(granite.unembed.W_U, hf.model.embed_tokens.weight.T / 4.0) <= 1e-7
    assert granite.cfg.attn_scale == pytest.approx(1 / 0.3)
    cohere, hf = hooked_from(build("cohere_tied_logit_scale")), build("cohere_tied_logit_scale")
    assert torch.equal(cohere.unembed.W_U, hf.lm_head.weight.T * 2.0)
    assert cohere.cfg.parallel_attn_mlp and cohere.cfg.rotary_adjacent_pairs


def test_falcon_alibi_is_added_before_the_scaling_once():
    """hooked computes `(q.k + alibi) / sqrt(d_head)` (HF's SDPA path); HF's eager path counts the bias twice."""
    name = "falcon_rw_alibi_vs_hf_sdpa"
    sdpa, eager = build(name), build(name, attn_implementation="eager")
    model, t = hooked_from(sdpa), tokens(2, 16)
    assert model.cfg.positional_embedding_type == "alibi" and model.cfg.alibi_before_attn_scale
    with torch.no_grad():
        assert max_abs(model(t), sdpa(t).logits) <= ATOL
        assert max_abs(model(t), eager(t).logits) > 1e-3


def test_hunyuan_normalizes_q_and_k_after_rotary():
    """The rotated q and k are normalized (hook order), and normalizing before rotary gives other logits."""
    model = hooked_from(build("hunyuan_qk_norm_after_rotary"))
    order = []
    names = ("blocks.0.attn.hook_rot_q", "blocks.0.attn.q_norm.hook_normalized")
    hooks = [(name, lambda x, hook: order.append(hook.name)) for name in names]
    t = tokens(2, 16)
    with torch.no_grad():
        after = model.run_with_hooks(t, fwd_hooks=hooks)
        model.cfg.qk_norm_after_rotary = False
        before = model(t)
    assert order == list(names) and max_abs(after, before) > 1e-3


def test_cases_cover_every_modern_family():
    """The parity cases above build each of these HF classes (removing a family's last case fails here)."""
    families = {
        "CohereForCausalLM",
        "FalconForCausalLM",
        "GraniteForCausalLM",
        "HunYuanDenseV1ForCausalLM",
        "LlamaForCausalLM",
        "OlmoForCausalLM",
        "Olmo2ForCausalLM",
        "Olmo3ForCausalLM",
        "Phi3ForCausalLM",
        "SmolLM3ForCausalLM",
    }
    assert {case[0] + "ForCausalLM" for case in CASES.values()} == families
