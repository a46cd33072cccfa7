"""Phi-1 / 1.5 / 2 (`PhiForCausalLM`): parallel block with one shared LayerNorm, partial rotary, biases everywhere.

    per layer:  n = input_layernorm(x);  x + attn(n) + mlp(n)
    logits = lm_head(final_layernorm(x))     (lm_head has a bias: b_U)

Rotary (NeoX half split) covers `int(d_head * partial_rotary_factor)` dims (phi-1: 0.5, phi-2:
0.4). The optional `qk_layernorm` is one LayerNorm (with bias) over d_head, shared by all heads.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from hooked.loading.common import strip_prefix, unembed_weights
from hooked.loading.parts import (
    decoder_config,
    dense_mlp,
    layer_norm,
    partial_rotary_dim,
    prefixed,
    projections,
    rotary_config,
    shared_layer_norm,
)
from hooked.loading.registry import register_architecture


def convert_phi_config(hf: Any) -> dict:
    d_head = hf.hidden_size // hf.num_attention_heads
    return dict(
        decoder_config(hf, d_head),
        n_key_value_heads=hf.num_key_value_heads or hf.num_attention_heads,
        eps=hf.layer_norm_eps,
        normalization_type="LN",
        **rotary_config(hf, partial_rotary_dim(hf, d_head)),
        parallel_attn_mlp=True,
        parallel_residual_last=True,
        use_qk_norm=hf.qk_layernorm,
        default_prepend_bos=False,
        original_architecture="PhiForCausalLM",
    )


def convert_phi_weights(hf_state: Mapping[str, torch.Tensor], cfg) -> dict[str, torch.Tensor]:
    hf = strip_prefix(hf_state, "model.")
    sd = {"embed.W_E": hf["embed_tokens.weight"]}  # [d_vocab, d_model]
    for layer in range(cfg.n_layers):
        p = f"layers.{layer}."
        block = {
            **shared_layer_norm(hf, p + "input_layernorm", cfg.d_model),
            **projections(hf, p + "self_attn.", ("q_proj", "k_proj", "v_proj", "dense"), cfg),
            **dense_mlp(hf, p + "mlp.fc1", p + "mlp.fc2"),
        }
        if cfg.use_qk_norm:
            block.update(layer_norm(hf, p + "self_attn.q_layernorm", "attn.q_norm", cfg.d_head))
            block.update(layer_norm(hf, p + "self_attn.k_layernorm", "attn.k_norm", cfg.d_head))
        sd.update(prefixed(f"blocks.{layer}.", block))
    sd.update(layer_norm(hf, "final_layernorm", "ln_final", cfg.d_model))
    sd.update(unembed_weights(hf.get("lm_head.weight"), sd["embed.W_E"], hf.get("lm_head.bias")))
    return sd


register_architecture(("PhiForCausalLM",), convert_phi_config, convert_phi_weights)
