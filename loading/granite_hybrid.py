"""Granite-hybrid (`GraniteMoeHybridForCausalLM`, Granite 4.0): Mamba-2 and attention layers, MoE MLPs, multipliers.

    x = embed_tokens(tokens) * embedding_multiplier
    per layer:  x += residual_multiplier * mamba(input_layernorm(x))     (`mamba`: components/mamba2.py)
             or x += residual_multiplier * self_attn(input_layernorm(x)) (`attention`: rotary or none,
                                                                           scores * attention_multiplier)
                n  = post_attention_layernorm(x)
                x += residual_multiplier * (block_sparse_moe(n) + shared_mlp(n))
    logits = lm_head(norm(x)) / logits_scaling

As Granite (`loading/granite.py`), the four multipliers are folded into the weights: `W_E`, every
sublayer's output weights (the Mamba-2 `W_out`, `W_O`, each expert's and the shared MLP's `W_out`)
and `W_U`. The router is GraniteMoE's (`router_scoring="topk_softmax"`: the top-k float32 logits and a
softmax over them); the shared MLP is an always-on SwiGLU expert without a gate (`shared_expert_gate=False`).
Without experts (`num_local_experts=0`) the shared MLP is a dense gated MLP.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from hooked.loading.common import act_fn_name, hf_rope_parameters, strip_prefix, unembed_weights
from hooked.loading.config_checks import require_rope_types, require_supported
from hooked.loading.llama import attention_weights
from hooked.loading.mamba import mamba2_mixer_weights
from hooked.loading.moe import expert_weights
from hooked.loading.registry import register_architecture

#: HF 5 names (and the legacy names of older configs)
LAYER_TYPES = {"linear_attention": "mamba2", "full_attention": "attention", "mamba": "mamba2", "attention": "attention"}


def convert_granite_hybrid_config(hf: Any) -> dict:
    family = "GraniteMoeHybridForCausalLM"
    kinds = require_supported(
        hf, family, "layer_types", lambda v: set(v) <= set(LAYER_TYPES), describe=str(LAYER_TYPES)
    )
    rope = require_supported(hf, family, "position_embedding_type", ("rope", None))
    require_rope_types(hf, family, ("default",))
    require_supported(hf, family, "hidden_act", ("silu",))
    base, _ = hf_rope_parameters(hf)
    d_head = hf.hidden_size // hf.num_attention_heads
    experts = hf.num_local_experts or 0
    moe = (
        dict(d_mlp=hf.intermediate_size, num_experts=experts, experts_per_token=hf.num_experts_per_tok,
             router_scoring="topk_softmax", norm_topk_prob=True, shared_expert_d_mlp=hf.shared_intermediate_size,
             shared_expert_gate=False)
        if experts
        else dict(d_mlp=hf.shared_intermediate_size)
    )  # fmt: skip
    return dict(
        d_model=hf.hidden_size,
        d_head=d_head,
        n_heads=hf.num_attention_heads,
        n_key_value_heads=hf.num_key_value_heads or hf.num_attention_heads,
        n_layers=hf.num_hidden_layers,
        n_ctx=hf.max_position_embeddings,
        d_vocab=hf.vocab_size,
        act_fn=act_fn_name(hf.hidden_act),
        gated_mlp=True,
        **moe,
        eps=hf.rms_norm_eps,
        normalization_type="RMS",
        attn_scale=1.0 / hf.attention_multiplier,
        positional_embedding_type="rotary",
        rotary_dim=d_head,
        rotary_base=base,
        nope_layers=None if rope == "rope" else list(range(hf.num_hidden_layers)),
        layer_types=[LAYER_TYPES[kind] for kind in kinds],
        ssm_d_state=hf.mamba_d_state,
        ssm_d_inner=int(hf.mamba_expand * hf.hidden_size),
        ssm_n_heads=hf.mamba_n_heads,
        ssm_n_groups=hf.mamba_n_groups,
        ssm_conv_kernel=hf.mamba_d_conv,
        ssm_chunk_size=hf.mamba_chunk_size,
        ssm_dt_limit=tuple(hf.time_step_limit),
        ssm_act_fn=act_fn_name(hf.hidden_act),
        embed_scale=hf.embedding_multiplier,
        residual_scale=hf.residual_multiplier,
        logit_scale=1.0 / hf.logits_scaling,
        original_architecture=family,
        default_prepend_bos=False,
    )


def _mlp_weights(hf: Mapping[str, torch.Tensor], p: str, cfg) -> dict[str, torch.Tensor]:
    """`block_sparse_moe` (router, fused experts) and `shared_mlp` (fused SwiGLU) -> `mlp.*`."""
    shared_in, shared_out = hf[p + "shared_mlp.input_linear.weight"], hf[p + "shared_mlp.output_linear.weight"]
    gate, up = shared_in.chunk(2, dim=0)  # [d_shared, d_model] each: the activation's input first
    if not cfg.uses_moe:
        zeros = lambda n: torch.zeros(n, dtype=shared_in.dtype)  # noqa: E731
        return {
            "mlp.W_gate": gate.T, "mlp.W_in": up.T, "mlp.W_out": shared_out.T,
            "mlp.b_gate": zeros(gate.shape[0]), "mlp.b_in": zeros(up.shape[0]), "mlp.b_out": zeros(cfg.d_model),
        }  # fmt: skip
    moe = p + "block_sparse_moe."
    on_disk = moe + "input_linear.weight" in hf  # the checkpoint's names; transformers 5 renames them in memory
    routed = {
        "gate.weight": hf[moe + ("router.layer.weight" if on_disk else "router.weight")],
        "experts.gate_up_proj": hf[moe + ("input_linear.weight" if on_disk else "experts.gate_up_proj")],
        "experts.down_proj": hf[moe + ("output_linear.weight" if on_disk else "experts.down_proj")],
    }
    out = {"mlp." + k: v for k, v in expert_weights(routed, "", cfg, ("", "", "")).items()}
    out.update({"mlp.shared_expert.W_gate.weight": gate, "mlp.shared_expert.W_in.weight": up})
    out["mlp.shared_expert.W_out.weight"] = shared_out  # [d_model, d_shared]
    return out


def fold_hybrid_multipliers(sd: dict[str, torch.Tensor], cfg) -> dict[str, torch.Tensor]:
    """Multiply `W_E` by `embed_scale`, every sublayer's output weights by `residual_scale`, `W_U` by `logit_scale`."""
    writers = ["attn.W_O", "attn.b_O", "mixer.W_out", "mixer.b_out", "mlp.W_out", "mlp.b_out"]
    writers += ["mlp.shared_expert.W_out.weight"] + [
        f"mlp.experts.{e}.W_out.weight" for e in range(cfg.num_experts or 0)
    ]
    scales = {"embed.W_E": cfg.embed_scale, "unembed.W_U": cfg.logit_scale, "unembed.b_U": cfg.logit_scale}
    scales.update({f"blocks.{layer}.{w}": cfg.residual_scale for layer in range(cfg.n_layers) for w in writers})
    return {k: (v * scales[k] if scales.get(k, 1.0) != 1.0 else v) for k, v in sd.items()}


def convert_granite_hybrid_weights(hf_state: Mapping[str, torch.Tensor], cfg) -> dict[str, torch.Tensor]:
    """HF Granite-hybrid state dict (`model.layers.{l}...`) -> TransformerLens-style names, multipliers folded."""
    hf = strip_prefix(hf_state, "model.")
    sd = {"embed.W_E": hf["embed_tokens.weight"]}  # [d_vocab, d_model]
    for layer, kind in enumerate(cfg.mixer_types):
        p, b = f"layers.{layer}.", f"blocks.{layer}."
        sd[b + "ln1.w"], sd[b + "ln2.w"] = hf[p + "input_layernorm.weight"], hf[p + "post_attention_layernorm.weight"]
        if kind == "mamba2":
            sd.update({b + "mixer." + k: v for k, v in mamba2_mixer_weights(hf, p + "mamba.").items()})
        else:
            sd.update({b + k: v for k, v in attention_weights(hf, p + "self_attn.", cfg).items()})
        sd.update({b + k: v for k, v in _mlp_weights(hf, p, cfg).items()})
    sd["ln_final.w"] = hf["norm.weight"]
    sd.update(unembed_weights(hf_state.get("lm_head.weight"), sd["embed.W_E"]))
    return fold_hybrid_multipliers(sd, cfg)


register_architecture(("GraniteMoeHybridForCausalLM",), convert_granite_hybrid_config, convert_granite_hybrid_weights)
