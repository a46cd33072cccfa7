"""Gemma's pieces one by one: the `(1 + w)` gain-first RMSNorm, the embedding scale, sandwich norms,
soft-caps, weight processing, and loading from saved checkpoints."""

from __future__ import annotations

import logging

import pytest
import torch

from hooked import HookedTransformer, HookedTransformerConfig
from hooked.components.norms import RMSNorm, RMSNormGainFirst, make_norm
from tests.acceptance.test_gemma_parity import tokens
from tests.helpers import max_abs
from tests.tiny_models import GEMMA_CONFIGS, NO_PROCESSING, gemma_layers, hooked_from, tiny_gemma


@pytest.fixture(scope="module")
def gemma2():
    hf = tiny_gemma("gemma2_softcaps_window", seed=1)
    return hf, hooked_from(hf)


@pytest.fixture(scope="module")
def gemma3():
    hf = tiny_gemma("gemma3_mixed_rope", seed=2)
    return hf, hooked_from(hf)


# -- the (1 + w) RMSNorm -------------------------------------------------------------------


def _norm_cfg(dtype=torch.float32, **kw):
    return HookedTransformerConfig(
        d_model=16, d_head=4, n_layers=1, n_ctx=8, d_vocab=10, act_fn="gelu", normalization_type="RMS",
        eps=1e-6, dtype=dtype, **kw,
    )  # fmt: skip


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gain_first_norm_is_hf_gemma_rmsnorm_bit_for_bit(dtype):
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm

    torch.manual_seed(0)
    hf = Gemma3RMSNorm(16, eps=1e-6)
    with torch.no_grad():
        hf.weight.copy_(0.5 * torch.randn(16))
    ours = make_norm(_norm_cfg(torch.float32, norm_gain_in_fp32=True))
    assert type(ours) is RMSNormGainFirst
    with torch.no_grad():
        ours.w.copy_(1.0 + hf.weight.float())  # the stored gain is 1 + w
    x = (3 * torch.randn(2, 5, 16)).to(dtype)
    with torch.no_grad():
        assert torch.equal(ours(x), hf(x))
        if dtype == torch.bfloat16:  # casting before the gain (LLaMA's order) differs: the test can fail
            cast_first = RMSNorm(_norm_cfg())
            cast_first.w.copy_(ours.w)
            assert not torch.equal(cast_first(x), hf(x))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gain_first_norm_keeps_its_gain_in_float32_like_hf_gemma(dtype):
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm

    torch.manual_seed(3)
    hf = Gemma3RMSNorm(16, eps=1e-6).to(dtype)  # HF in half precision: w in dtype, 1 + w in float32
    with torch.no_grad():
        hf.weight.copy_(0.3 * torch.randn(16))
    ours = make_norm(_norm_cfg(dtype, norm_gain_in_fp32=True, norm_gain_offset=1.0))
    assert ours.w.dtype == torch.float32
    with torch.no_grad():
        ours.w.copy_(1.0 + hf.weight.float())
    x = (3 * torch.randn(2, 5, 16)).to(dtype)
    with torch.no_grad():
        assert torch.equal(ours(x), hf(x))
        rounded = RMSNormGainFirst(_norm_cfg(norm_gain_in_fp32=True))  # the same gain rounded to dtype first
        rounded.w.copy_(ours.w.to(dtype).float())
        assert not torch.equal(rounded(x), hf(x))


def test_gain_first_norm_gain_stays_float32_through_to():
    norm = make_norm(_norm_cfg(torch.float32, norm_gain_in_fp32=True, norm_gain_offset=1.0))
    w_hf = 0.001 * torch.arange(1.0, 17.0)
    with torch.no_grad():
        norm.w.copy_(1.0 + w_hf)  # not representable in bfloat16
    for dtype in (torch.bfloat16, torch.float16):
        norm.to(torch.float32).w.data = 1.0 + w_hf
        norm.to(dtype)
        hf_gain = 1.0 + w_hf.to(dtype).float()  # an HF model cast to dtype: w rounded, 1 + w in float32
        assert norm.w.dtype == torch.float32 and torch.equal(norm.w, hf_gain), dtype
        assert not torch.equal(hf_gain, (1.0 + w_hf).to(dtype).float())  # rounding the sum instead differs
        norm.to(dtype)
        assert torch.equal(norm.w, hf_gain)  # casting again changes nothing
    assert norm.double().w.dtype == torch.float64  # not a half dtype: the gain follows
    no_offset = make_norm(_norm_cfg(torch.bfloat16, norm_gain_in_fp32=True))  # OLMo-2: HF's gain is w itself
    assert no_offset.w.dtype == torch.bfloat16


def test_half_precision_gemma_keeps_hf_gains_in_float32_through_loading_and_state_dict(gemma3):
    hf, _ = gemma3
    model = hooked_from(hf, dtype=torch.bfloat16)  # from the float32 HF model: w rounded to bf16, as HF's cast
    gains = {n: p for n, p in model.named_parameters() if n.endswith(("ln1.w", "ln2_post.w", "q_norm.w", "ln_final.w"))}
    assert len(gains) == 3 * model.cfg.n_layers + 1
    assert all(p.dtype == torch.float32 for p in gains.values()) and model.W_Q.dtype == torch.bfloat16
    for layer, block in zip(
        hf.model.layers, model.blocks, strict=True
    ):  # what HF's bf16 norms multiply by, bit for bit
        assert torch.equal(block.ln1.w, 1.0 + layer.input_layernorm.weight.to(torch.bfloat16).float())
        assert torch.equal(block.attn.q_norm.w, 1.0 + layer.self_attn.q_norm.weight.to(torch.bfloat16).float())
    toks = tokens(2, 8)
    with torch.no_grad():
        logits = model(toks)
    fresh = HookedTransformer(model.cfg)  # a state-dict round trip keeps the float32 gains
    fresh.load_state_dict(model.state_dict())
    assert fresh.blocks[0].ln1.w.dtype == torch.float32 and torch.equal(fresh.blocks[0].ln1.w, model.blocks[0].ln1.w)
    with torch.no_grad():
        assert torch.equal(fresh(toks), logits)


def test_gain_first_norm_is_transparent_to_hooks_in_bf16():
    torch.manual_seed(1)
    norm = make_norm(_norm_cfg(norm_gain_in_fp32=True))
    with torch.no_grad():
        norm.w.copy_(1 + 0.5 * torch.randn(16))
    x = (3 * torch.randn(2, 5, 16)).to(torch.bfloat16)
    with torch.no_grad():
        plain = norm(x)
        seen = []
        norm.hook_normalized.add_hook(lambda t, hook: seen.append(t.dtype))
        norm.hook_scale.add_hook(lambda t, hook: None)
        assert torch.equal(norm(x), plain) and seen == [torch.bfloat16]
        norm.hook_normalized.add_hook(lambda t, hook: t.clone())  # a copy of the same values is no edit
        assert torch.equal(norm(x), plain)
        norm.hook_normalized.add_hook(lambda t, hook: t * 0)  # an edit reaches the output
        assert torch.equal(norm(x), torch.zeros_like(plain))


# -- conversion facts ----------------------------------------------------------------------


@pytest.mark.parametrize("name", list(GEMMA_CONFIGS))
def test_converted_weights_and_config(name):
    hf = tiny_gemma(name, seed=3)
    model = hooked_from(hf)
    cfg, layers = model.cfg, gemma_layers(hf)
    text = getattr(hf.config, "text_config", hf.config)
    W_E = hf.get_input_embeddings().weight
    assert cfg.embed_scale == text.hidden_size**0.5 and cfg.norm_gain_in_fp32 and cfg.act_fn == "gelu_pytorch_tanh"
    assert torch.equal(model.embed.W_E, W_E * torch.tensor(text.hidden_size**0.5))  # scaled in the weight dtype
    assert torch.equal(model.unembed.W_U, hf.lm_head.weight.T)  # unscaled, tied or not
    assert not model.embeddings_tied()  # the scaled W_E is a copy
    assert torch.equal(model.blocks[1].ln1.w, 1 + layers[1].input_layernorm.weight)
    sandwich = not name.startswith("gemma1")
    assert cfg.use_normalization_before_and_after == sandwich
    if sandwich:
        assert torch.equal(model.blocks[1].ln1_post.w, 1 + layers[1].post_attention_layernorm.weight)
        assert torch.equal(model.blocks[1].ln2.w, 1 + layers[1].pre_feedforward_layernorm.weight)
        assert torch.equal(model.blocks[1].ln2_post.w, 1 + layers[1].post_feedforward_layernorm.weight)
        assert cfg.attn_scale == 24**0.5
        assert cfg.attn_types == ["local" if t == "sliding_attention" else "global" for t in text.layer_types]
    else:
        assert torch.equal(model.blocks[1].ln2.w, 1 + layers[1].post_attention_layernorm.weight)
        assert cfg.attn_scale == 16**0.5
    assert cfg.use_qk_norm == name.startswith("gemma3")
    if cfg.use_qk_norm:
        assert torch.equal(model.blocks[0].attn.q_norm.w, 1 + layers[0].self_attn.q_norm.weight)
        assert (cfg.rotary_base, cfg.rotary_base_local) == (5000.0, 100.0)
        assert cfg.rotary_scaling == {"rope_type": "linear", "factor": 8.0} and cfg.rotary_scaling_local is None


def test_soft_caps_and_window_change_hf_logits_and_ours_follow():
    """Guard against vacuous Gemma 2 checks: without a cap or the window HF's logits move a lot, and ours follow."""
    name, t = "gemma2_softcaps_window", tokens()
    with torch.no_grad():
        ref = tiny_gemma(name, seed=4)(t).logits
        for change in (dict(attn_logit_softcapping=None), dict(final_logit_softcapping=None), dict(sliding_window=64)):
            hf = tiny_gemma(name, seed=4, **change)
            theirs = hf(t).logits
            assert max_abs(theirs, ref) > 1e-2, change
            assert max_abs(hooked_from(hf)(t), theirs) <= 1e-5, change


def test_bidirectional_gemma_is_rejected():
    from hooked.loading.gemma import convert_gemma3_config

    hf = tiny_gemma("gemma3_mixed_rope")
    hf.config.use_bidirectional_attention = True
    with pytest.raises(NotImplementedError, match="Bidirectional"):
        convert_gemma3_config(hf.config)


@pytest.mark.parametrize("name", ["gemma3_mixed_rope", "gemma3_image_text_tower", "gemma1_mha_untied"])
def test_loads_from_a_saved_safetensors_checkpoint(name, tmp_path):
    hf = tiny_gemma(name, seed=5)
    hf.save_pretrained(tmp_path, safe_serialization=True)
    model = HookedTransformer.from_pretrained(str(tmp_path), **NO_PROCESSING)
    t = tokens()
    with torch.no_grad():
        assert max_abs(model(t), hf(input_ids=t).logits) <= 1e-5


# -- sandwich norms, hooks and weight processing ------------------------------------------------


def test_post_norm_hooks_fire_once_with_their_shapes(gemma3):
    _, model = gemma3
    fired = {}
    names = [
        f"blocks.1.{n}.{h}"
        for n in ("ln1_post", "ln2_post", "attn.q_norm", "attn.k_norm")
        for h in ("hook_scale", "hook_normalized")
    ]
    hooks = [(n, lambda t, hook: fired.setdefault(hook.name, []).append(tuple(t.shape))) for n in names]
    with torch.no_grad():
        model.run_with_hooks(tokens(), fwd_hooks=hooks)
    H, Hkv, dh, d = model.cfg.n_heads, model.cfg.n_kv_heads, model.cfg.d_head, model.cfg.d_model
    assert fired["blocks.1.ln1_post.hook_scale"] == [(2, 12, 1)] and fired["blocks.1.ln2_post.hook_normalized"] == [
        (2, 12, d)
    ]
    assert fired["blocks.1.attn.q_norm.hook_normalized"] == [(2, 12, H, dh)]
    assert fired["blocks.1.attn.k_norm.hook_scale"] == [(2, 12, Hkv, 1)]


@pytest.mark.parametrize("name", list(GEMMA_CONFIGS))
def test_processing_folds_pre_norms_only_and_is_idempotent(name, caplog):
    hf = tiny_gemma(name, seed=6)
    with caplog.at_level(logging.INFO):
        model = HookedTransformer.from_pretrained("processed", hf_model=hf)
    cfg = model.cfg
    assert "fold_ln" in cfg.weight_processing and "fold_value_biases" in cfg.weight_processing
    assert "center_writing_weights" not in cfg.weight_processing  # RMSNorm models: not exact, not done
    assert ("center_unembed" in cfg.weight_processing) == (cfg.output_logits_soft_cap <= 0)
    keys = set(model.state_dict())
    assert "blocks.0.ln1.w" not in keys and "blocks.0.ln2.w" not in keys and "ln_final.w" not in keys
    post = {"blocks.0.ln1_post.w", "blocks.0.ln2_post.w"}
    assert post <= keys if cfg.use_normalization_before_and_after else not (post & keys)
    assert ("blocks.0.attn.q_norm.w" in keys) == cfg.use_qk_norm
    before = {k: v.clone() for k, v in model.state_dict().items()}
    model.process_weights_()
    after = model.state_dict()
    assert set(after) == set(before) and all(torch.equal(after[k], before[k]) for k in before)


def test_image_text_checkpoint_keys_on_disk_and_in_memory_convert_alike():
    """Older Gemma 3 image-text checkpoints store `language_model.model.*` and `language_model.lm_head.*` on disk."""
    from hooked.loading.gemma import convert_gemma_weights

    hf = tiny_gemma("gemma3_image_text_tower", seed=7)
    cfg = hooked_from(hf).cfg
    memory = hf.state_dict()
    disk = {}
    for key, value in memory.items():
        if key.startswith("model.language_model."):
            disk["language_model.model." + key.removeprefix("model.language_model.")] = value.clone()
        elif key == "lm_head.weight":
            disk["language_model.lm_head.weight"] = value.clone()
        else:
            disk[key] = value
    ours, theirs = convert_gemma_weights(memory, cfg), convert_gemma_weights(disk, cfg)
    assert set(ours) == set(theirs) and all(torch.equal(ours[k], theirs[k]) for k in ours)
