"""DeepSeek-V2 and V3 (`DeepseekV2ForCausalLM`, `DeepseekV3ForCausalLM`): latent attention and routed experts.

    x = embed_tokens(tokens)
    per layer:  n = input_layernorm(x)
                x += o_proj(MLA(n))                                    components/mla.py
                n = post_attention_layernorm(x)
                x += mlp(n)   a dense SwiGLU on the first `first_k_dense_replace` layers, else
                              routed experts + `n_shared_experts` always-on ones (summed, ungated)
    logits = lm_head(norm(x))

| | V2 | V3 |
|---|---|---|
| rotary | adjacent pairs, complex product in float32 | `rope_interleave`: pairs in, halves out; else halves |
| router | softmax; `greedy` or `group_limited_greedy` (a group scores its best expert) | sigmoid + `e_score_correction_bias`; groups score their two best |
| weights | the chosen probabilities (HF ignores `norm_topk_prob`) | renormalized if `norm_topk_prob` |

Both: the router weight stays float32 (its logits are float32), the weights are multiplied
by `routed_scaling_factor`, and the experts' outputs are weighted in float32. The attention
scale is `1/sqrt(d_head)`, times `mscale(factor, mscale_all_dim)^2` under YaRN with
`mscale_all_dim`, as HF. The latent norms use eps 1e-6 whatever `rms_norm_eps` is (HF's).

Weights: `q_a_proj`/`q_a_layernorm`/`q_b_proj` (or `q_proj`), `kv_a_proj_with_mqa` `[r + rope, d]`,
`kv_a_layernorm`, `kv_b_proj` `[H * (nope + v), r]`, `o_proj` become `attn.W_Q_A`, `q_a_norm.w`,
`W_Q_B`, `W_KV_A`, `kv_a_norm.w`, `W_KV_B`, `W_O` (right-multiplying views). The experts load
from the fused transformers-5 tensors or one Linear per expert (`loading/moe.py`).
"""  # noqa: E501 - a markdown table keeps each row on one line

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from hooked.loading.common import (
    bias_or_zeros,
    heads_in,
    heads_out,
    hf_rope_parameters,
    strip_prefix,
    unembed_weights,
)
from hooked.loading.config_checks import refuse, require_activation, require_rope_types, require_supported
from hooked.loading.llama import gated_mlp_weights
from hooked.loading.moe import QWEN_EXPERT_NAMES, expert_weights
from hooked.loading.registry import register_architecture

# -- config -----------------------------------------------------------------------------


def mla_config(hf: Any, family: str) -> dict:
    """The `HookedTransformerConfig` fields of a DeepSeek-shaped model with latent attention (no routing yet)."""
    require_rope_types(hf, family, ("default", "yarn", "linear"))
    per_head = "MLA gives every head its own keys: num_key_value_heads == num_attention_heads"
    require_supported(
        hf, family, "num_key_value_heads", lambda n: n in (None, hf.num_attention_heads), describe=per_head
    )
    partial = (getattr(hf, "rope_parameters", None) or {}).get("partial_rotary_factor", 1.0)
    if partial != 1.0:
        refuse(
            family, "rope_parameters['partial_rotary_factor']", partial, "supported: 1.0 (rotary on qk_rope_head_dim)"
        )
    d_head = hf.qk_nope_head_dim + hf.qk_rope_head_dim
    base, scaling = hf_rope_parameters(hf)
    act = require_activation(hf, "hidden_act", family)
    return dict(
        d_model=hf.hidden_size, d_head=d_head, d_head_v=hf.v_head_dim, n_heads=hf.num_attention_heads,
        n_layers=hf.num_hidden_layers, n_ctx=hf.max_position_embeddings, d_vocab=hf.vocab_size,
        act_fn=act, gated_mlp=True, eps=hf.rms_norm_eps, normalization_type="RMS",
        positional_embedding_type="rotary", rotary_dim=hf.qk_rope_head_dim, rotary_base=base, rotary_scaling=scaling,
        kv_lora_rank=hf.kv_lora_rank, q_lora_rank=hf.q_lora_rank, attn_scale=1.0 / mla_softmax_scale(hf, d_head),
        default_prepend_bos=True,
    )  # fmt: skip


def mla_softmax_scale(hf: Any, d_head: int) -> float:
    """HF's `yarn_apply_mscale`: `d_head^-0.5`, times `mscale(factor, mscale_all_dim)^2` when both are set."""
    scaling = d_head**-0.5
    params = getattr(hf, "rope_parameters", None) or {}
    mscale_all_dim = params.get("mscale_all_dim", 0)
    if params.get("rope_type", "default") != "default" and mscale_all_dim:
        factor = params["factor"]
        mscale = 1.0 if factor <= 1 else 0.1 * mscale_all_dim * math.log(factor) + 1.0
        scaling = scaling * mscale * mscale
    return scaling


def routed_experts_config(hf: Any, dense_layers: list[int]) -> dict:
    """Expert, shared-expert and dense-layer fields of DeepSeek-shaped mixtures of experts (DeepSeek, GLM)."""
    n_shared = getattr(hf, "n_shared_experts", 0) or 0
    dense, expert = hf.intermediate_size, hf.moe_intermediate_size
    widths = [dense if i in dense_layers else expert for i in range(hf.num_hidden_layers)]  # each layer's MLP width
    return dict(
        d_mlp=hf.moe_intermediate_size,
        num_experts=hf.n_routed_experts,
        experts_per_token=hf.num_experts_per_tok,
        routed_scaling_factor=float(hf.routed_scaling_factor),
        shared_expert_d_mlp=hf.moe_intermediate_size * n_shared or None,
        shared_expert_gate=False,
        dense_mlp_layers=dense_layers or None,
        layer_d_mlp=widths if dense_layers else None,
        router_in_fp32=True,
        moe_mix_in_fp32=True,  # the float32 routing weights multiply the experts' outputs, cast after the sum
    )


def sigmoid_routing(hf: Any) -> dict:
    """DeepSeek-V3's router (GLM's too): sigmoid scores, correction bias, groups scored by their two best."""
    groups = hf.n_group or 1
    return dict(
        router_scoring="sigmoid",
        norm_topk_prob=bool(hf.norm_topk_prob),
        router_groups=groups if groups > 1 else None,  # one group: HF's group step keeps every expert
        router_topk_groups=hf.topk_group if groups > 1 else None,
    )


def convert_deepseek_v2_config(hf: Any) -> dict:
    family = "DeepseekV2ForCausalLM"
    method = require_supported(hf, family, "topk_method", ("greedy", "group_limited_greedy"), default="greedy")
    require_supported(hf, family, "mlp_bias", (False,), default=False)
    grouped = method == "group_limited_greedy"
    return dict(
        mla_config(hf, family),
        **routed_experts_config(hf, list(range(hf.first_k_dense_replace))),
        router_scoring="softmax",
        norm_topk_prob=False,  # HF's V2 router never renormalizes (its `norm_topk_prob` is unused)
        router_groups=hf.n_group if grouped else None,
        router_topk_groups=hf.topk_group if grouped else None,
        rotary_adjacent_pairs=True,  # HF rotates (x0, x1), (x2, x3) ... as complex numbers, in float32
        rotary_in_fp32=True,
        rotary_tables_in_fp32=True,
        original_architecture=family,
    )


def convert_deepseek_v3_config(hf: Any) -> dict:
    family = "DeepseekV3ForCausalLM"
    return dict(
        mla_config(hf, family),
        **routed_experts_config(hf, list(range(hf.first_k_dense_replace or 0))),
        **sigmoid_routing(hf),
        rotary_interleaved_input=bool(hf.rope_interleave),
        original_architecture=family,
    )


# -- weights ----------------------------------------------------------------------------


def mla_weights(hf: Mapping[str, torch.Tensor], p: str, cfg) -> dict[str, torch.Tensor]:
    """HF's MLA projections under `p` (`...self_attn.`) -> `attn.*` (views)."""
    H, d = cfg.n_heads, cfg.d_model
    out: dict[str, torch.Tensor] = {}
    if cfg.q_lora_rank:
        w = hf[p + "q_a_proj.weight"]  # [q_lora_rank, d_model]
        out["attn.W_Q_A"] = w.T  # [d_model, q_lora_rank]
        out["attn.b_Q_A"] = bias_or_zeros(hf, p + "q_a_proj.bias", cfg.q_lora_rank, w)
        out["attn.q_a_norm.w"] = hf[p + "q_a_layernorm.weight"]
        out["attn.W_Q_B"] = heads_in(hf[p + "q_b_proj.weight"], H, cfg.d_head)  # [head, q_lora_rank, d_head]
    else:
        out["attn.W_Q_B"] = heads_in(hf[p + "q_proj.weight"], H, cfg.d_head)  # [head, d_model, d_head]
    w = hf[p + "kv_a_proj_with_mqa.weight"]  # [r + rotary_dim, d_model]
    out["attn.W_KV_A"] = w.T  # [d_model, r + rotary_dim]
    out["attn.b_KV_A"] = bias_or_zeros(hf, p + "kv_a_proj_with_mqa.bias", w.shape[0], w)
    out["attn.kv_a_norm.w"] = hf[p + "kv_a_layernorm.weight"]
    d_kv = cfg.d_head - cfg.rotary_dim + cfg.d_value
    out["attn.W_KV_B"] = heads_in(hf[p + "kv_b_proj.weight"], H, d_kv)  # [head, r, d_nope + d_value]
    w_o = hf[p + "o_proj.weight"]  # [d_model, head * d_value]
    out["attn.W_O"] = heads_out(w_o, H, cfg.d_value)  # [head, d_value, d_model]
    out["attn.b_O"] = bias_or_zeros(hf, p + "o_proj.bias", d, w_o)
    return out


def deepseek_mlp_weights(hf: Mapping[str, torch.Tensor], p: str, layer: int, cfg) -> dict[str, torch.Tensor]:
    """A dense SwiGLU layer, or the router (+ correction bias), routed experts and shared experts under `p`."""
    if not cfg.is_moe_layer(layer):
        return gated_mlp_weights(hf, p, cfg.layer_config(layer))
    out = {"mlp." + k: v for k, v in expert_weights(hf, p, cfg, QWEN_EXPERT_NAMES).items()}
    if cfg.router_scoring == "sigmoid":
        out["mlp.e_score_correction_bias"] = hf[p + "gate.e_score_correction_bias"]  # [num_experts]
    if cfg.shared_expert_d_mlp:
        for ours, theirs in (("W_gate", "gate_proj"), ("W_in", "up_proj"), ("W_out", "down_proj")):
            out[f"mlp.shared_expert.{ours}.weight"] = hf[p + f"shared_experts.{theirs}.weight"]
    return out


def convert_deepseek_weights(hf_state: Mapping[str, torch.Tensor], cfg) -> dict[str, torch.Tensor]:
    """HF DeepSeek-V2/V3 state dict (`model.layers.{l}...`) -> TransformerLens names and shapes (views)."""
    hf = strip_prefix(hf_state, "model.")
    sd = {"embed.W_E": hf["embed_tokens.weight"]}  # [d_vocab, d_model]
    for layer in range(cfg.n_layers):
        p, b = f"layers.{layer}.", f"blocks.{layer}."
        sd[b + "ln1.w"] = hf[p + "input_layernorm.weight"]
        sd.update({b + k: v for k, v in mla_weights(hf, p + "self_attn.", cfg).items()})
        sd[b + "ln2.w"] = hf[p + "post_attention_layernorm.weight"]
        sd.update({b + k: v for k, v in deepseek_mlp_weights(hf, p + "mlp.", layer, cfg).items()})
    sd["ln_final.w"] = hf["norm.weight"]
    sd.update(unembed_weights(hf.get("lm_head.weight"), sd["embed.W_E"]))
    return sd


register_architecture(("DeepseekV2ForCausalLM",), convert_deepseek_v2_config, convert_deepseek_weights)
register_architecture(("DeepseekV3ForCausalLM",), convert_deepseek_v3_config, convert_deepseek_weights)
