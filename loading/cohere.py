"""Cohere / Command-R (`CohereForCausalLM`): a parallel block with one bias-free LayerNorm.

    n = input_layernorm(x)                       # LayerNorm without bias (centred, times w)
    x = x + o_proj(attention(n)) + mlp(n)        # parallel: ln2 is ln1
    logits = lm_head(norm(x)) * logit_scale

Rotary uses GPT-J's adjacent pairs (`repeat_interleave`d tables), over the whole head.
Optional per-head qk LayerNorms (`use_qk_norm`: weights `[heads, d_head]`, no bias) run
before rotary. The bias-free LayerNorm is a `LayerNorm` with a zero `b`, so it folds as
one (`fold_ln` is exact). `logit_scale` is folded into `W_U` (`cfg.logit_scale` records it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from hooked.loading.common import strip_prefix, unembed_weights
from hooked.loading.granite import fold_scalar_multipliers
from hooked.loading.llama import attention_weights, gated_mlp_weights, llama_shaped_config
from hooked.loading.registry import register_architecture


def convert_cohere_config(hf: Any) -> dict:
    return dict(
        llama_shaped_config(hf, "CohereForCausalLM"),
        normalization_type="LN",
        eps=hf.layer_norm_eps,
        parallel_attn_mlp=True,
        rotary_adjacent_pairs=True,
        use_qk_norm=bool(hf.use_qk_norm),
        qk_norm_per_head=bool(hf.use_qk_norm),
        logit_scale=hf.logit_scale,
        norm_gain_in_fp32=True,  # CohereLayerNorm: (w * n32).to(dtype), two plain means
        rotary_in_fp32=True,  # HF rotates q.float(), k.float() with the dtype's cos/sin, then casts back
        default_prepend_bos=True,
    )


def _bias_free(w: torch.Tensor) -> torch.Tensor:
    return torch.zeros(w.shape, dtype=w.dtype, device=w.device)


def convert_cohere_weights(hf_state: Mapping[str, torch.Tensor], cfg) -> dict[str, torch.Tensor]:
    hf = strip_prefix(hf_state, "model.")
    sd = {"embed.W_E": hf["embed_tokens.weight"]}  # [d_vocab, d_model]
    for layer in range(cfg.n_layers):
        p, b = f"layers.{layer}.", f"blocks.{layer}."
        ln = hf[p + "input_layernorm.weight"]  # [d_model], read by both sublayers
        sd.update({b + "ln1.w": ln, b + "ln1.b": _bias_free(ln), b + "ln2.w": ln, b + "ln2.b": _bias_free(ln)})
        attn = attention_weights(hf, p + "self_attn.", cfg)  # with q_norm.w/k_norm.w [heads, d_head] if use_qk_norm
        if cfg.use_qk_norm:
            attn.update({f"attn.{n}.b": _bias_free(attn[f"attn.{n}.w"]) for n in ("q_norm", "k_norm")})
        sd.update({b + k: v for k, v in attn.items()})
        sd.update({b + k: v for k, v in gated_mlp_weights(hf, p + "mlp.", cfg).items()})
    sd.update({"ln_final.w": hf["norm.weight"], "ln_final.b": _bias_free(hf["norm.weight"])})
    sd.update(unembed_weights(hf.get("lm_head.weight"), sd["embed.W_E"]))
    return fold_scalar_multipliers(sd, cfg)


register_architecture(("CohereForCausalLM",), convert_cohere_config, convert_cohere_weights)
