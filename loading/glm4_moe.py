"""GLM-4-MoE (`Glm4MoeForCausalLM`, GLM-4.5/4.6): LLaMA-shaped attention, DeepSeek-V3's routed experts.

    attention: grouped-query, q/k/v biases (`attention_bias`), optional per-head qk RMSNorm
               (`use_qk_norm`) before rotary, rotary on the first `partial_rotary_factor` of each
               head (NeoX halves)
    MLP:       a dense SwiGLU on the first `first_k_dense_replace` layers; else DeepSeek-V3's
               router (float32, sigmoid scores + correction bias, optional groups, renormalized,
               `routed_scaling_factor`) over `n_routed_experts`, plus ungated shared experts

Attention loads as LLaMA's (`loading/llama.py`), the MLPs as DeepSeek's (`loading/deepseek.py`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from hooked.loading.common import strip_prefix, unembed_weights
from hooked.loading.config_checks import require_rope_types
from hooked.loading.deepseek import deepseek_mlp_weights, routed_experts_config, sigmoid_routing
from hooked.loading.llama import attention_weights, llama_shaped_config
from hooked.loading.parts import partial_rotary_dim
from hooked.loading.registry import register_architecture

FAMILY = "Glm4MoeForCausalLM"


def convert_glm4_moe_config(hf: Any) -> dict:
    require_rope_types(hf, FAMILY, ("default", "linear", "yarn"))
    fields = llama_shaped_config(hf, FAMILY)
    return dict(
        fields,
        rotary_dim=partial_rotary_dim(hf, fields["d_head"]),
        use_qk_norm=bool(hf.use_qk_norm),
        **routed_experts_config(hf, list(range(hf.first_k_dense_replace))),
        **sigmoid_routing(hf),
        default_prepend_bos=False,
    )


def convert_glm4_moe_weights(hf_state: Mapping[str, torch.Tensor], cfg) -> dict[str, torch.Tensor]:
    hf = strip_prefix(hf_state, "model.")
    sd = {"embed.W_E": hf["embed_tokens.weight"]}  # [d_vocab, d_model]
    for layer in range(cfg.n_layers):
        p, b = f"layers.{layer}.", f"blocks.{layer}."
        sd[b + "ln1.w"] = hf[p + "input_layernorm.weight"]
        sd.update({b + k: v for k, v in attention_weights(hf, p + "self_attn.", cfg).items()})
        sd[b + "ln2.w"] = hf[p + "post_attention_layernorm.weight"]
        sd.update({b + k: v for k, v in deepseek_mlp_weights(hf, p + "mlp.", layer, cfg).items()})
    sd["ln_final.w"] = hf["norm.weight"]
    sd.update(unembed_weights(hf.get("lm_head.weight"), sd["embed.W_E"]))
    return sd


register_architecture((FAMILY,), convert_glm4_moe_config, convert_glm4_moe_weights)
