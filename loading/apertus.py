"""Apertus (`ApertusForCausalLM`): LLaMA-shaped attention with qk-norm, a dense xIELU MLP.

    x = embed_tokens(tokens)
    per layer:  n = attention_layernorm(x)
                x += o_proj(attention(rotary(q_norm(q_proj(n))), rotary(k_norm(k_proj(n))), v_proj(n)))
                x += down_proj(xielu(up_proj(feedforward_layernorm(x))))
    logits = lm_head(norm(x))

RMSNorm everywhere (plain gain), per-head RMSNorm on queries and keys as Qwen3, no biases.
The MLP is not gated: `up_proj` -> `mlp.W_in`, `down_proj` -> `mlp.W_out`, and each layer's
trainable xIELU parameters `mlp.act_fn.{alpha_p, alpha_n, beta, eps}` (HF's shape `[1]`
for the alphas, a scalar in hooked) keep their names.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from hooked.loading.common import bias_or_zeros, strip_prefix, unembed_weights
from hooked.loading.llama import attention_weights, llama_shaped_config
from hooked.loading.registry import register_architecture

XIELU_KEYS = ("alpha_p", "alpha_n", "beta", "eps")


def convert_apertus_config(hf: Any) -> dict:
    return dict(
        llama_shaped_config(hf, "ApertusForCausalLM", extra_activations=("xielu",)),
        gated_mlp=False,
        use_qk_norm=True,
        default_prepend_bos=True,
    )


def dense_mlp_weights(hf: Mapping[str, torch.Tensor], p: str, cfg) -> dict[str, torch.Tensor]:
    """`down(act(up(x)))` -> `mlp.W_in` (up), `mlp.W_out` (down), plus a trainable activation's parameters."""
    up, down = hf[p + "up_proj.weight"], hf[p + "down_proj.weight"]  # [d_mlp, d_model], [d_model, d_mlp]
    out = {
        "mlp.W_in": up.T,  # [d_model, d_mlp]
        "mlp.b_in": bias_or_zeros(hf, p + "up_proj.bias", cfg.d_mlp, up),
        "mlp.W_out": down.T,  # [d_mlp, d_model]
        "mlp.b_out": bias_or_zeros(hf, p + "down_proj.bias", cfg.d_model, down),
    }
    for key in XIELU_KEYS:
        if p + f"act_fn.{key}" in hf:  # absent buffers keep the component's defaults
            out[f"mlp.act_fn.{key}"] = hf[p + f"act_fn.{key}"].reshape(())  # []
    return out


def convert_apertus_weights(hf_state: Mapping[str, torch.Tensor], cfg) -> dict[str, torch.Tensor]:
    hf = strip_prefix(hf_state, "model.")
    sd = {"embed.W_E": hf["embed_tokens.weight"]}  # [d_vocab, d_model]
    for layer in range(cfg.n_layers):
        p, b = f"layers.{layer}.", f"blocks.{layer}."
        sd[b + "ln1.w"] = hf[p + "attention_layernorm.weight"]
        sd[b + "ln2.w"] = hf[p + "feedforward_layernorm.weight"]
        sd.update({b + k: v for k, v in attention_weights(hf, p + "self_attn.", cfg).items()})
        sd.update({b + k: v for k, v in dense_mlp_weights(hf, p + "mlp.", cfg).items()})
    sd["ln_final.w"] = hf["norm.weight"]
    sd.update(unembed_weights(hf.get("lm_head.weight"), sd["embed.W_E"]))
    return sd


register_architecture(("ApertusForCausalLM",), convert_apertus_config, convert_apertus_weights)
