"""Qwen2.5-VL (`Qwen2_5_VLForConditionalGeneration`): a window-attention ViT, a patch merger and Qwen2 with M-RoPE.

    patches = conv3d(pixels)                            # [patches, d_vision]: each image at its own grid (t, h, w)
    per block (window order): x += proj(attention_2d_rope(norm1(x)))   within a window, or the whole image
                              x += down(silu(gate(n)) * up(n)),  n = norm2(x)        (RMSNorm, biases)
    tokens  = mlp.2(gelu(mlp.0(ln_q(x) as 2 x 2 squares)))   # the merger: one token per square
    the language model: Qwen2's, with 3-D positions (time, row, column) for image tokens (M-RoPE)

The language model converts as Qwen2's (`hooked.loading.llama`); the ViT's blocks become
`vision.blocks.{i}` (`norm1`/`norm2` -> `ln1`/`ln2`, the fused `qkv` split per head, `proj` -> `W_O`),
the patch embedding `vision.embed.W_patch`, the merger `projector.*`. Videos are not converted.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from hooked.loading.common import bias_or_zeros
from hooked.loading.config_checks import require_activation, require_rope_types
from hooked.loading.llama import gated_mlp_weights
from hooked.loading.parts import attention, prefixed
from hooked.loading.registry import register_architecture
from hooked.loading.vision_towers import first_prefix, text_model_config, text_model_weights

FAMILY = "Qwen2_5_VLForConditionalGeneration"
_VISION_PREFIXES = ("model.visual.", "visual.")


def convert_qwen2_5_vl_config(hf: Any) -> dict:
    """The language model's fields (Qwen2's) and `vision_language`: the ViT, windows, merger, M-RoPE."""
    require_rope_types(hf.text_config, FAMILY, {"default"})
    text_class, fields = text_model_config(hf.text_config, FAMILY)
    v = hf.vision_config
    section = (hf.text_config.rope_parameters or {}).get("mrope_section")
    head = v.hidden_size // v.num_heads
    act = require_activation(v, "hidden_act", FAMILY, path="vision_config.hidden_act")
    blocks = dict(
        d_model=v.hidden_size, d_head=head, n_heads=v.num_heads, n_layers=v.depth, n_ctx=1 << 16,
        d_mlp=v.intermediate_size, act_fn=act, gated_mlp=True, normalization_type="RMS",
        eps=1e-6, attention_dir="bidirectional", positional_embedding_type="rotary", rotary_dim=head,
        rotary_in_fp32=True, rotary_tables_in_fp32=True, original_architecture="Qwen2_5_VisionTransformer",
        init_weights=False,
    )  # fmt: skip
    vision = dict(
        vision=blocks, image_size=v.patch_size, patch_size=v.patch_size, image_token_id=hf.image_token_id,
        num_channels=v.in_channels, feature_layers=(v.depth,), projector="merger", projector_act="gelu",
        projector_eps=1e-6, temporal_patch_size=v.temporal_patch_size, spatial_merge_size=v.spatial_merge_size,
        window_size=v.window_size, full_attention_blocks=tuple(v.fullatt_block_indexes),
        vision_rotary_base=float((v.rope_parameters or {}).get("rope_theta", 10000.0)),
        mrope_section=tuple(section) if section else None, extra=dict(text_architecture=text_class),
    )  # fmt: skip
    return dict(fields, original_architecture=FAMILY, vision_language=vision)


def convert_qwen2_5_vl_weights(state: Mapping[str, torch.Tensor], cfg) -> dict[str, torch.Tensor]:
    vcfg = cfg.vision_language
    sd = text_model_weights(state, cfg, vcfg.extra["text_architecture"])
    p = first_prefix(state, _VISION_PREFIXES, "patch_embed.proj.weight")
    vision = {"embed.W_patch": state[p + "patch_embed.proj.weight"]}  # [d, C, T, P, P]
    for layer in range(vcfg.vision.n_layers):
        sd_block = _vision_block(state, f"{p}blocks.{layer}.", vcfg.vision)
        vision.update(prefixed(f"blocks.{layer}.", sd_block))
    sd.update(prefixed("vision.", vision))
    w_in, w_out = state[p + "merger.mlp.0.weight"], state[p + "merger.mlp.2.weight"]  # [4d, 4d], [d_model, 4d]
    sd.update({
        "projector.norm.w": state[p + "merger.ln_q.weight"],  # [d_vision]
        "projector.W_in": w_in.T,  # [4 d_vision, 4 d_vision]
        "projector.b_in": bias_or_zeros(state, p + "merger.mlp.0.bias", w_in.shape[0], w_in),
        "projector.W_out": w_out.T,  # [4 d_vision, d_model]
        "projector.b_out": bias_or_zeros(state, p + "merger.mlp.2.bias", w_out.shape[0], w_out),
    })  # fmt: skip
    return sd


def _vision_block(state: Mapping[str, torch.Tensor], p: str, cfg) -> dict[str, torch.Tensor]:
    """One ViT block: RMSNorm gains, the fused `qkv` (rows q, then k, then v) split, `proj`, the gated MLP."""
    qkv, qkv_bias = state[p + "attn.qkv.weight"], state[p + "attn.qkv.bias"]  # [3 d, d], [3 d]
    q, k, v = qkv.chunk(3, dim=0)  # [d, d] each: HF reshapes the output to (3, heads, d_head)
    biases = (*qkv_bias.chunk(3), state.get(p + "attn.proj.bias"))
    out = {"ln1.w": state[p + "norm1.weight"], "ln2.w": state[p + "norm2.weight"]}
    out.update(attention(q, k, v, state[p + "attn.proj.weight"], biases, cfg))
    out.update(gated_mlp_weights(state, p + "mlp.", cfg))
    return out


register_architecture((FAMILY,), convert_qwen2_5_vl_config, convert_qwen2_5_vl_weights)
