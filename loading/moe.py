"""Mixture-of-experts decoders with LLaMA-shaped attention: Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE.

Attention and norms are exactly those of `loading/llama.py`; the MLP of every layer is
a `components.moe.MoE`. The families differ in the router and the extras:

| family    | experts key (disk)                           | renormalize top-k  | extras                                |
|-----------|----------------------------------------------|--------------------|---------------------------------------|
| Mixtral   | `block_sparse_moe.experts.{e}.w1/w3/w2`      | always             | sliding window on every layer         |
| Qwen2-MoE | `mlp.experts.{e}.gate_proj/up_proj/down_proj`| `norm_topk_prob`   | q/k/v bias; sigmoid-gated shared expert|
| Qwen3-MoE | as Qwen2-MoE                                 | `norm_topk_prob`   | per-head qk-norm                       |
| OLMoE     | as Qwen2-MoE                                 | `norm_topk_prob`   | full-width qk-norm, then `clip_qkv`    |

transformers 5 holds the experts of a live model fused (`mlp.experts.gate_up_proj`
`[E, 2*d_mlp, d_model]` with the gate first, `mlp.experts.down_proj` `[E, d_model, d_mlp]`,
see its `conversion_mapping.py`), while checkpoints on disk keep one Linear per expert:
`expert_weights` reads both. Layers with a dense MLP (`mlp_only_layers`,
`decoder_sparse_step > 1`) are not supported.
"""  # noqa: E501 - a markdown table keeps each row on one line

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from hooked.loading.common import strip_prefix, unembed_weights
from hooked.loading.config_checks import family_of, refuse
from hooked.loading.llama import attention_weights, llama_shaped_config, local_attention, qwen_local_layers
from hooked.loading.registry import register_architecture

# -- config -----------------------------------------------------------------------------


def _check_all_layers_sparse(hf: Any) -> None:
    dense = list(getattr(hf, "mlp_only_layers", None) or [])
    step = getattr(hf, "decoder_sparse_step", 1)
    dense += [layer for layer in range(hf.num_hidden_layers) if (layer + 1) % step]
    if dense:
        field = "mlp_only_layers" if getattr(hf, "mlp_only_layers", None) else "decoder_sparse_step"
        refuse(
            family_of(hf),
            field,
            getattr(hf, field),
            f"layers {sorted(set(dense))} would have a dense MLP; only "
            "models whose every layer is a mixture of experts are supported",
        )


def moe_config(hf: Any, architecture: str, num_experts: int, d_mlp: int, norm_topk_prob: bool) -> dict:
    """LLaMA-shaped fields plus the MoE ones (`d_mlp` is each expert's width)."""
    _check_all_layers_sparse(hf)
    return dict(
        llama_shaped_config(hf, architecture),
        d_mlp=d_mlp,
        num_experts=num_experts,
        experts_per_token=hf.num_experts_per_tok,
        norm_topk_prob=norm_topk_prob,
    )


def convert_mixtral_config(hf: Any) -> dict:
    window = getattr(hf, "sliding_window", None)
    return dict(
        moe_config(hf, "MixtralForCausalLM", hf.num_local_experts, hf.intermediate_size, norm_topk_prob=True),
        **local_attention(window, [True] * hf.num_hidden_layers),
        moe_mix_in_fp32=True,  # HF's Mixtral weighs each expert's output by its float32 routing weight
        default_prepend_bos=True,
    )


def convert_qwen2_moe_config(hf: Any) -> dict:
    window = hf.sliding_window if getattr(hf, "use_sliding_window", False) else None
    return dict(
        moe_config(hf, "Qwen2MoeForCausalLM", hf.num_experts, hf.moe_intermediate_size, hf.norm_topk_prob),
        **local_attention(window, qwen_local_layers(hf)),
        shared_expert_d_mlp=hf.shared_expert_intermediate_size or None,
        default_prepend_bos=False,
    )


def convert_qwen3_moe_config(hf: Any) -> dict:
    window = hf.sliding_window if getattr(hf, "use_sliding_window", False) else None
    return dict(
        moe_config(hf, "Qwen3MoeForCausalLM", hf.num_experts, hf.moe_intermediate_size, hf.norm_topk_prob),
        **local_attention(window, [True] * hf.num_hidden_layers),
        use_qk_norm=True,
        default_prepend_bos=False,
    )


def convert_olmoe_config(hf: Any) -> dict:
    return dict(
        moe_config(hf, "OlmoeForCausalLM", hf.num_experts, hf.intermediate_size, hf.norm_topk_prob),
        use_qk_norm=True,
        full_width_qk_norm=True,
        clip_qkv=hf.clip_qkv,
        default_prepend_bos=True,
    )


# -- weights ----------------------------------------------------------------------------

# Per-expert Linear names on disk: (gate, up, down).
QWEN_EXPERT_NAMES = ("gate_proj", "up_proj", "down_proj")
MIXTRAL_EXPERT_NAMES = ("w1", "w3", "w2")


def expert_weights(
    hf: Mapping[str, torch.Tensor], p: str, cfg, names: tuple[str, str, str], router: str = "gate.weight"
) -> dict[str, torch.Tensor]:
    """Router `p + router` and the experts under `p + "experts."` -> TL MoE keys (views).

    Accepts the fused transformers-5 tensors or one `{gate, up, down}` Linear per expert.
    """
    out = {"W_gate.weight": hf[p + router]}  # [num_experts, d_model]
    fused = p + "experts.gate_up_proj" in hf
    if fused:
        gate_up = hf[p + "experts.gate_up_proj"]  # [num_experts, 2 * d_mlp, d_model], gate first
        down = hf[p + "experts.down_proj"]  # [num_experts, d_model, d_mlp]
    gate, up, down_name = names
    for e in range(cfg.num_experts):
        q, x = f"experts.{e}.", p + f"experts.{e}."
        if fused:
            out[q + "W_gate.weight"] = gate_up[e, : cfg.d_mlp]  # [d_mlp, d_model]
            out[q + "W_in.weight"] = gate_up[e, cfg.d_mlp :]  # [d_mlp, d_model]
            out[q + "W_out.weight"] = down[e]  # [d_model, d_mlp]
        else:
            out[q + "W_gate.weight"] = hf[x + f"{gate}.weight"]
            out[q + "W_in.weight"] = hf[x + f"{up}.weight"]
            out[q + "W_out.weight"] = hf[x + f"{down_name}.weight"]
    return out


def shared_expert_weights(hf: Mapping[str, torch.Tensor], p: str) -> dict[str, torch.Tensor]:
    """Qwen2-MoE's `shared_expert.{gate,up,down}_proj` and `shared_expert_gate` (nn.Linear layout, as stored)."""
    out = {"shared_expert_gate.weight": hf[p + "shared_expert_gate.weight"]}  # [1, d_model]
    for ours, theirs in (("W_gate", "gate_proj"), ("W_in", "up_proj"), ("W_out", "down_proj")):
        out[f"shared_expert.{ours}.weight"] = hf[p + f"shared_expert.{theirs}.weight"]
    return out


def _moe_prefix(hf: Mapping[str, torch.Tensor], layer_prefix: str) -> str:
    """Mixtral's on-disk `block_sparse_moe.`, or the `mlp.` of transformers 5 and the Qwen models."""
    legacy = layer_prefix + "block_sparse_moe."
    return legacy if legacy + "gate.weight" in hf else layer_prefix + "mlp."


def make_moe_weights(names: tuple[str, str, str]):
    def convert(hf_state: Mapping[str, torch.Tensor], cfg) -> dict[str, torch.Tensor]:
        """HF MoE state dict (`model.layers.{l}...`) -> TransformerLens names (views)."""
        hf = strip_prefix(hf_state, "model.")
        sd = {"embed.W_E": hf["embed_tokens.weight"]}  # [d_vocab, d_model]
        for layer in range(cfg.n_layers):
            p, b = f"layers.{layer}.", f"blocks.{layer}."
            sd[b + "ln1.w"] = hf[p + "input_layernorm.weight"]
            sd.update({b + k: v for k, v in attention_weights(hf, p + "self_attn.", cfg).items()})
            sd[b + "ln2.w"] = hf[p + "post_attention_layernorm.weight"]
            moe = _moe_prefix(hf, p)
            sd.update({b + "mlp." + k: v for k, v in expert_weights(hf, moe, cfg, names).items()})
            if cfg.shared_expert_d_mlp:
                sd.update({b + "mlp." + k: v for k, v in shared_expert_weights(hf, moe).items()})
        sd["ln_final.w"] = hf["norm.weight"]
        sd.update(unembed_weights(hf.get("lm_head.weight"), sd["embed.W_E"]))
        return sd

    return convert


convert_mixtral_weights = make_moe_weights(MIXTRAL_EXPERT_NAMES)
convert_qwen_moe_weights = make_moe_weights(QWEN_EXPERT_NAMES)

register_architecture(("MixtralForCausalLM",), convert_mixtral_config, convert_mixtral_weights)
register_architecture(("Qwen2MoeForCausalLM",), convert_qwen2_moe_config, convert_qwen_moe_weights)
register_architecture(("Qwen3MoeForCausalLM",), convert_qwen3_moe_config, convert_qwen_moe_weights)
register_architecture(("OlmoeForCausalLM",), convert_olmoe_config, convert_qwen_moe_weights)
