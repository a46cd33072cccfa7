"""HunYuan dense (`HunYuanDenseV1ForCausalLM`): LLaMA's layout with a per-head RMSNorm of q and k *after* rotary.

    per layer:  q, k = rotary(q_proj(n)), rotary(k_proj(n));  q, k = query_layernorm(q), key_layernorm(k)
    (everything else as `loading/llama.py`)

Its checkpoints call their rope `dynamic` with a fixed `alpha`, which HF computes as NTK-aware
scaling with a static base (`ntk_alpha`): `base = rope_theta * alpha^(d_head / (d_head - 2))`.
The converter folds that into `rotary_base`; plain `dynamic` (no alpha) and the LLaMA kinds load as usual.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from hooked.loading.common import strip_prefix
from hooked.loading.config_checks import require_rope_types
from hooked.loading.llama import convert_llama_weights, llama_shaped_config
from hooked.loading.registry import register_architecture

ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "llama3")


def ntk_alpha_base(hf: Any, d_head: int) -> float | None:
    """HF's `ntk_alpha` base, `rope_theta * alpha^(d_head / (d_head - 2))`, or None without an `alpha`."""
    params = dict(getattr(hf, "rope_parameters", None) or {})
    if params.get("rope_type") != "dynamic" or not params.get("alpha"):
        return None
    return params["rope_theta"] * params["alpha"] ** (d_head / (d_head - 2))


def convert_hunyuan_config(hf: Any) -> dict:
    require_rope_types(hf, "HunYuanDenseV1", ROPE_TYPES)
    fields: dict[str, Any] = dict(
        llama_shaped_config(hf, "HunYuanDenseV1ForCausalLM"),
        use_qk_norm=True,
        qk_norm_after_rotary=True,
        default_prepend_bos=True,
    )
    base = ntk_alpha_base(hf, fields["d_head"])
    if base is not None:  # a fixed alpha: static frequencies from the stretched base
        fields.update(rotary_base=base, rotary_scaling=None)
    return fields


def convert_hunyuan_weights(hf_state: Mapping[str, torch.Tensor], cfg) -> dict[str, torch.Tensor]:
    """LLaMA's tensors, plus `query_layernorm`/`key_layernorm` as `attn.q_norm`/`attn.k_norm` (`[d_head]`)."""
    sd = convert_llama_weights(hf_state, cfg.replace(use_qk_norm=False, qk_norm_after_rotary=False))
    hf = strip_prefix(hf_state, "model.")
    for layer in range(cfg.n_layers):
        p = f"layers.{layer}.self_attn."
        sd[f"blocks.{layer}.attn.q_norm.w"] = hf[p + "query_layernorm.weight"]  # [d_head], shared by the heads
        sd[f"blocks.{layer}.attn.k_norm.w"] = hf[p + "key_layernorm.weight"]
    return sd


register_architecture(("HunYuanDenseV1ForCausalLM",), convert_hunyuan_config, convert_hunyuan_weights)
