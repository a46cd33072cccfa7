"""GraniteMoE (`GraniteMoeForCausalLM`): Granite's four multipliers (`loading/granite.py`) on a mixture of experts.

    x = embed_tokens(tokens) * embedding_multiplier     -> W_E * embed_scale
    scores = q k^T * attention_multiplier                -> attn_scale = 1 / attention_multiplier
    x = x + residual_multiplier * sublayer(x)            -> W_O, b_O and every expert's W_out * residual_scale
    logits = lm_head(norm(x)) / logits_scaling           -> W_U * logit_scale
    MLP: the top-k of the router's logits, weighted by a softmax over those k (cast to the model dtype)

As for Granite, the multipliers are folded into the weights at conversion, so hook values
follow the folded weights. Experts load from transformers 5's fused
`block_sparse_moe.experts.gate_up_proj`/`down_proj` or the checkpoint's
`block_sparse_moe.input_linear`/`output_linear` (gate first), the router from
`block_sparse_moe.router.weight` or `router.layer.weight`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from hooked.loading.common import strip_prefix, unembed_weights
from hooked.loading.config_checks import require_rope_types
from hooked.loading.llama import attention_weights, llama_shaped_config
from hooked.loading.moe import QWEN_EXPERT_NAMES, expert_weights
from hooked.loading.registry import register_architecture

FAMILY = "GraniteMoeForCausalLM"


def convert_granitemoe_config(hf: Any) -> dict:
    require_rope_types(hf, FAMILY, ("default", "linear", "llama3", "yarn"))
    return dict(
        llama_shaped_config(hf, FAMILY),
        num_experts=hf.num_local_experts,
        experts_per_token=hf.num_experts_per_tok,
        router_scoring="topk_softmax",
        norm_topk_prob=True,  # a softmax over the chosen logits: the chosen probabilities, renormalized
        attn_scale=1.0 / hf.attention_multiplier,
        embed_scale=hf.embedding_multiplier,
        residual_scale=hf.residual_multiplier,
        logit_scale=1.0 / hf.logits_scaling,
        default_prepend_bos=False,
    )


def _moe(hf: Mapping[str, torch.Tensor], p: str, cfg) -> dict[str, torch.Tensor]:
    if p + "input_linear.weight" in hf:  # the checkpoint's names
        renamed = {
            p + "router.weight": hf[p + "router.layer.weight"],  # [num_experts, d_model]
            p + "experts.gate_up_proj": hf[p + "input_linear.weight"],  # [num_experts, 2 * d_mlp, d_model]
            p + "experts.down_proj": hf[p + "output_linear.weight"],  # [num_experts, d_model, d_mlp]
        }
        return expert_weights(renamed, p, cfg, QWEN_EXPERT_NAMES, router="router.weight")
    return expert_weights(hf, p, cfg, QWEN_EXPERT_NAMES, router="router.weight")


def fold_multipliers(sd: dict[str, torch.Tensor], cfg) -> dict[str, torch.Tensor]:
    """Granite's multipliers into the weights: `W_E`, every residual writer (experts included), `W_U` (new tensors)."""

    def scale(keys: list[str], factor: float | None) -> None:
        if factor not in (None, 1.0):
            sd.update({k: sd[k] * factor for k in keys})

    scale(["embed.W_E"], cfg.embed_scale)
    scale([k for k in sd if k.endswith(("attn.W_O", "attn.b_O", "W_out.weight"))], cfg.residual_scale)
    scale(["unembed.W_U", "unembed.b_U"], cfg.logit_scale)
    return sd


def convert_granitemoe_weights(hf_state: Mapping[str, torch.Tensor], cfg) -> dict[str, torch.Tensor]:
    hf = strip_prefix(hf_state, "model.")
    sd = {"embed.W_E": hf["embed_tokens.weight"]}  # [d_vocab, d_model]
    for layer in range(cfg.n_layers):
        p, b = f"layers.{layer}.", f"blocks.{layer}."
        sd[b + "ln1.w"] = hf[p + "input_layernorm.weight"]
        sd.update({b + k: v for k, v in attention_weights(hf, p + "self_attn.", cfg).items()})
        sd[b + "ln2.w"] = hf[p + "post_attention_layernorm.weight"]
        sd.update({b + "mlp." + k: v for k, v in _moe(hf, p + "block_sparse_moe.", cfg).items()})
    sd["ln_final.w"] = hf["norm.weight"]
    sd.update(unembed_weights(hf.get("lm_head.weight"), sd["embed.W_E"]))
    return fold_multipliers(sd, cfg)


register_architecture((FAMILY,), convert_granitemoe_config, convert_granitemoe_weights)
