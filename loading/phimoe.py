"""PhiMoE (`PhimoeForCausalLM`, Phi-3.5-MoE): LLaMA-shaped attention, LayerNorms, and the sparsemixer router.

    norms:     LayerNorm with bias (`eps = rms_norm_eps`), `lm_head` with an optional bias
    attention: grouped-query, optional biases (`attention_bias`), optional sliding window on every layer
    MLP:       `num_local_experts` SwiGLU experts; the router's logits go through sparsemixer, which
               picks two experts, each weighted by a softmax over the experts whose logit is close to
               its own (`router_jitter_noise`, `components/moe_routing.py`)

The experts load from transformers 5's fused `mlp.experts.*` or the checkpoint's
`block_sparse_moe.experts.{e}.w1/w3/w2`, the router from `mlp.router` or `block_sparse_moe.gate`.
HF's PhiMoE LongRoPE keeps the short factors at every length and scales cos/sin by
`short_mscale` or `long_mscale` by the length: it loads when the two scales are equal (as in
Phi-3.5-MoE), as a LongRoPE whose long factors are the short ones; unequal scales are refused.
`fold_ln` is skipped (a LayerNorm bias cannot fold into the bias-free experts and router).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from hooked.loading.common import bias_or_zeros, strip_prefix, unembed_weights
from hooked.loading.config_checks import refuse, require_rope_types, require_supported
from hooked.loading.llama import attention_weights, llama_shaped_config, local_attention
from hooked.loading.moe import MIXTRAL_EXPERT_NAMES, expert_weights
from hooked.loading.parts import layer_norm
from hooked.loading.registry import register_architecture

FAMILY = "PhimoeForCausalLM"


def convert_phimoe_config(hf: Any) -> dict:
    require_rope_types(hf, FAMILY, ("default", "longrope"))
    require_supported(hf, FAMILY, "num_experts_per_tok", (2,), describe="sparsemixer picks exactly two experts")
    window = getattr(hf, "sliding_window", None)
    return dict(
        llama_shaped_config(hf, FAMILY),
        **_longrope(hf),
        **local_attention(window, [True] * hf.num_hidden_layers),
        normalization_type="LN",
        num_experts=hf.num_local_experts,
        experts_per_token=2,
        router_scoring="sparsemixer",
        sparsemixer_jitter_eps=float(hf.router_jitter_noise),
        default_prepend_bos=True,
    )


def _longrope(hf: Any) -> dict:
    """HF's PhiMoE LongRoPE as `rotary_scaling`: the short factors at every length, cos/sin scaled by the mscale."""
    params = dict(getattr(hf, "rope_parameters", None) or {})
    if params.get("rope_type") != "longrope":
        return {}
    short, long = params["short_mscale"], params["long_mscale"]
    if short != long:
        refuse(FAMILY, "rope_parameters['long_mscale']", long, f"equal to short_mscale ({short}): one cos/sin scale")
    scaling = dict(
        rope_type="longrope",
        short_factor=params["short_factor"],
        long_factor=params["short_factor"],  # HF's PhiMoE computes its frequencies without the length
        original_max_position_embeddings=params["original_max_position_embeddings"],
        attention_factor=float(short),
    )
    return dict(rotary_scaling=scaling)


def _moe(hf: Mapping[str, torch.Tensor], p: str, cfg) -> dict[str, torch.Tensor]:
    """The router and experts: the checkpoint's `block_sparse_moe.*`, or transformers 5's `mlp.*`."""
    if p + "block_sparse_moe.gate.weight" in hf:
        return expert_weights(hf, p + "block_sparse_moe.", cfg, MIXTRAL_EXPERT_NAMES)
    return expert_weights(hf, p + "mlp.", cfg, MIXTRAL_EXPERT_NAMES, router="router.weight")


def convert_phimoe_weights(hf_state: Mapping[str, torch.Tensor], cfg) -> dict[str, torch.Tensor]:
    hf = strip_prefix(hf_state, "model.")
    sd = {"embed.W_E": hf["embed_tokens.weight"]}  # [d_vocab, d_model]
    for layer in range(cfg.n_layers):
        p, b = f"layers.{layer}.", f"blocks.{layer}."
        sd.update({b + k: v for k, v in layer_norm(hf, p + "input_layernorm", "ln1", cfg.d_model).items()})
        sd.update({b + k: v for k, v in attention_weights(hf, p + "self_attn.", cfg).items()})
        sd.update({b + k: v for k, v in layer_norm(hf, p + "post_attention_layernorm", "ln2", cfg.d_model).items()})
        sd.update({b + "mlp." + k: v for k, v in _moe(hf, p, cfg).items()})
    sd.update({k: v for k, v in layer_norm(hf, "norm", "ln_final", cfg.d_model).items()})
    lm_head = hf.get("lm_head.weight")
    bias = bias_or_zeros(hf, "lm_head.bias", cfg.d_vocab, sd["embed.W_E"])
    sd.update(unembed_weights(lm_head, sd["embed.W_E"], bias))
    return sd


register_architecture((FAMILY,), convert_phimoe_config, convert_phimoe_weights)
