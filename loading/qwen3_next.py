"""Qwen3-Next (`Qwen3NextForCausalLM`) and Qwen3.5 (`Qwen3_5ForCausalLM`, and the text tower of
`Qwen3_5ForConditionalGeneration`): gated DeltaNet layers with gated full attention every few layers.

    x = embed_tokens(tokens)
    per layer:  x += linear_attn(input_layernorm(x))   (`linear_attention`: components/gated_deltanet.py)
             or x += self_attn(input_layernorm(x))     (`full_attention`: gated, qk-norm, partial rotary)
                x += mlp(post_attention_layernorm(x))  (Qwen3-Next: MoE with a sigmoid-gated shared expert;
                                                        Qwen3.5: a dense SwiGLU)
    logits = lm_head(norm(x))

Every RMSNorm but the DeltaNet's gated one multiplies by `1 + w` in float32 (as Gemma): `ln*.w`,
`q_norm.w` and `k_norm.w` hold the gain `1 + w`. The attention's `q_proj` yields a query and an
output gate per head (`W_Q`, `W_gate`); rotary covers `partial_rotary_factor` of each head. Qwen3-Next's
DeltaNet projections are interleaved per key head (`in_proj_qkvz`, `in_proj_ba`); they are reordered
into Qwen3.5's order (`in_proj_qkv`, `in_proj_z`, `in_proj_b`, `in_proj_a`) side by side in one
`W_in`. Qwen3.5's multimodal rotary (`mrope_section`) gives text positions the plain rotary of one
position per token, which is what runs here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from hooked.loading.common import bias_or_zeros, heads_in, hf_rope_parameters, strip_prefix, unembed_weights
from hooked.loading.config_checks import require_rope_types, require_supported
from hooked.loading.llama import gated_mlp_weights
from hooked.loading.mamba import conv_weights
from hooked.loading.moe import QWEN_EXPERT_NAMES, _check_all_layers_sparse, expert_weights, shared_expert_weights
from hooked.loading.registry import register_architecture

LAYER_TYPES = {"linear_attention": "gated_deltanet", "full_attention": "attention"}


def _text(hf: Any) -> Any:
    return getattr(hf, "text_config", None) or hf


def _qwen3_next_config(hf: Any, architecture: str) -> dict:
    require_rope_types(hf, architecture, ("default",))
    require_supported(hf, architecture, "hidden_act", ("silu",))
    require_supported(hf, architecture, "layer_types", lambda v: set(v) <= set(LAYER_TYPES), describe=str(LAYER_TYPES))
    base, _ = hf_rope_parameters(hf)
    params = dict(getattr(hf, "rope_parameters", None) or {})
    partial = params.get("partial_rotary_factor", getattr(hf, "partial_rotary_factor", 1.0))
    return dict(
        d_model=hf.hidden_size,
        d_head=hf.head_dim,
        n_heads=hf.num_attention_heads,
        n_key_value_heads=hf.num_key_value_heads,
        n_layers=hf.num_hidden_layers,
        n_ctx=hf.max_position_embeddings,
        d_vocab=hf.vocab_size,
        act_fn="silu",
        gated_mlp=True,
        eps=hf.rms_norm_eps,
        normalization_type="RMS",
        norm_gain_in_fp32=True,  # (x * (1 + w)).to(dtype), in float32
        norm_gain_offset=1.0,
        use_qk_norm=True,
        attn_output_gate=True,
        positional_embedding_type="rotary",
        rotary_dim=int(hf.head_dim * partial),
        rotary_base=base,
        layer_types=[LAYER_TYPES[kind] for kind in hf.layer_types],
        ssm_conv_kernel=hf.linear_conv_kernel_dim,
        ssm_act_fn="silu",
        deltanet_n_key_heads=hf.linear_num_key_heads,
        deltanet_n_value_heads=hf.linear_num_value_heads,
        deltanet_d_key_head=hf.linear_key_head_dim,
        deltanet_d_value_head=hf.linear_value_head_dim,
        original_architecture=architecture,
        default_prepend_bos=False,
    )


def convert_qwen3_next_config(hf: Any) -> dict:
    _check_all_layers_sparse(hf)
    return dict(
        _qwen3_next_config(hf, "Qwen3NextForCausalLM"),
        d_mlp=hf.moe_intermediate_size,
        num_experts=hf.num_experts,
        experts_per_token=hf.num_experts_per_tok,
        norm_topk_prob=hf.norm_topk_prob,
        shared_expert_d_mlp=hf.shared_expert_intermediate_size or None,
    )


def convert_qwen3_5_config(hf: Any) -> dict:
    text = _text(hf)
    return dict(_qwen3_next_config(text, type(hf).__name__), d_mlp=text.intermediate_size)


# -- weights ----------------------------------------------------------------------------


def _gain(w: torch.Tensor) -> torch.Tensor:
    """HF's zero-centred RMSNorm multiplies by `1 + w`: store the gain (float64, where the sum is exact)."""
    return w.double() + 1.0


def gated_attention_weights(hf: Mapping[str, torch.Tensor], p: str, cfg) -> dict[str, torch.Tensor]:
    """`q_proj` (query and gate per head), `k_proj`, `v_proj`, `o_proj`, `q_norm`, `k_norm` -> `attn.*`."""
    H, Hkv, dh = cfg.n_heads, cfg.n_kv_heads, cfg.d_head
    q_and_gate = hf[p + "q_proj.weight"].view(H, 2, dh, -1)  # [head, (query, gate), d_head, d_model]
    q_bias = bias_or_zeros(hf, p + "q_proj.bias", 2 * H * dh, q_and_gate).view(H, 2, dh)
    out = {}
    for i, name in ((0, "Q"), (1, "gate")):
        w = q_and_gate[:, i].reshape(H * dh, -1)  # [head * d_head, d_model]
        out[f"attn.W_{name}"], out[f"attn.b_{name}"] = heads_in(w, H, dh), q_bias[:, i]  # [head, d_model, d_head]
    kv = "_" if cfg.uses_grouped_query_attention else ""
    for name, proj in (("K", "k_proj"), ("V", "v_proj")):
        w = hf[p + f"{proj}.weight"]  # [kv_head * d_head, d_model]
        out[f"attn.{kv}W_{name}"] = heads_in(w, Hkv, dh)
        out[f"attn.{kv}b_{name}"] = bias_or_zeros(hf, p + f"{proj}.bias", Hkv * dh, w).reshape(Hkv, dh)
    w_o = hf[p + "o_proj.weight"]  # [d_model, head * d_head]
    out["attn.W_O"] = w_o.T.reshape(H, dh, -1)  # [head, d_head, d_model]
    out["attn.b_O"] = bias_or_zeros(hf, p + "o_proj.bias", w_o.shape[0], w_o)
    out["attn.q_norm.w"], out["attn.k_norm.w"] = _gain(hf[p + "q_norm.weight"]), _gain(hf[p + "k_norm.weight"])
    return out


def _deltanet_projections(hf: Mapping[str, torch.Tensor], p: str, cfg) -> tuple[torch.Tensor, ...]:
    """`(qkv, z, b, a)` HF-layout weights `[out, d_model]`, from Qwen3.5's four or Qwen3-Next's two."""
    if p + "in_proj_qkv.weight" in hf:
        return tuple(hf[p + f"in_proj_{name}.weight"] for name in ("qkv", "z", "b", "a"))
    n_k, r = cfg.deltanet_n_key_heads, cfg.deltanet_n_value_heads // cfg.deltanet_n_key_heads
    dk, dv = cfg.deltanet_d_key_head, cfg.deltanet_d_value_head
    qkvz = hf[p + "in_proj_qkvz.weight"].view(n_k, 2 * dk + 2 * r * dv, -1)  # per key head: q, k, v, z
    q, k, v, z = (t.reshape(-1, qkvz.shape[-1]) for t in qkvz.split([dk, dk, r * dv, r * dv], dim=1))
    ba = hf[p + "in_proj_ba.weight"].view(n_k, 2 * r, -1)  # per key head: b, then a
    b, a = (t.reshape(-1, ba.shape[-1]) for t in ba.split([r, r], dim=1))
    return torch.cat([q, k, v]), z, b, a


def deltanet_weights(hf: Mapping[str, torch.Tensor], p: str, cfg) -> dict[str, torch.Tensor]:
    """`linear_attn.*` -> `GatedDeltaNet`'s parameters (right-multiplying projections)."""
    qkv, z, b, a = _deltanet_projections(hf, p, cfg)
    out = {"W_in": torch.cat([qkv, z, b, a]).T}  # [d_model, 2 key_dim + 2 value_dim + 2 value_head]
    out.update(conv_weights(hf, p + "conv1d"))
    out.update(dt_bias=hf[p + "dt_bias"], A_log=hf[p + "A_log"], W_out=hf[p + "out_proj.weight"].T)
    out["norm.w"] = hf[p + "norm.weight"]  # [d_value]: plain gain (not 1 + w)
    return out


_DECODER_PREFIXES = ("model.language_model.", "model.")


def convert_qwen3_next_weights(hf_state: Mapping[str, torch.Tensor], cfg) -> dict[str, torch.Tensor]:
    """HF Qwen3-Next / Qwen3.5 state dict -> TransformerLens-style names; norm gains `1 + w`."""
    prefix = next((p for p in _DECODER_PREFIXES if p + "embed_tokens.weight" in hf_state), "")
    hf = strip_prefix(hf_state, prefix)
    sd = {"embed.W_E": hf["embed_tokens.weight"]}  # [d_vocab, d_model]
    for layer, kind in enumerate(cfg.mixer_types):
        p, b = f"layers.{layer}.", f"blocks.{layer}."
        sd[b + "ln1.w"] = _gain(hf[p + "input_layernorm.weight"])
        sd[b + "ln2.w"] = _gain(hf[p + "post_attention_layernorm.weight"])
        if kind == "attention":
            sd.update({b + k: v for k, v in gated_attention_weights(hf, p + "self_attn.", cfg).items()})
        else:
            sd.update({b + "mixer." + k: v for k, v in deltanet_weights(hf, p + "linear_attn.", cfg).items()})
        if cfg.uses_moe:
            sd.update({b + "mlp." + k: v for k, v in expert_weights(hf, p + "mlp.", cfg, QWEN_EXPERT_NAMES).items()})
            sd.update({b + "mlp." + k: v for k, v in shared_expert_weights(hf, p + "mlp.").items()})
        else:
            sd.update({b + k: v for k, v in gated_mlp_weights(hf, p + "mlp.", cfg).items()})
    sd["ln_final.w"] = _gain(hf["norm.weight"])
    sd.update(unembed_weights(hf_state.get("lm_head.weight"), sd["embed.W_E"]))
    return sd


register_architecture(("Qwen3NextForCausalLM",), convert_qwen3_next_config, convert_qwen3_next_weights)
register_architecture(
    ("Qwen3_5ForCausalLM", "Qwen3_5ForConditionalGeneration"), convert_qwen3_5_config, convert_qwen3_next_weights
)
