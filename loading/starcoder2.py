"""StarCoder2 (`Starcoder2ForCausalLM`): the LLaMA layout with LayerNorm, biases, a dense
gelu MLP and a sliding window on every layer.

    per layer:  x += attn(input_layernorm(x));  x += c_proj(gelu(c_fc(post_attention_layernorm(x))))
    logits = lm_head(norm(x))          (tied)

Rotary (NeoX half split) over the whole head; grouped-query attention.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from hooked.loading.common import strip_prefix, unembed_weights
from hooked.loading.llama import local_attention
from hooked.loading.parts import decoder_config, dense_mlp, layer_norm, prefixed, projections, rotary_config
from hooked.loading.registry import register_architecture


def convert_starcoder2_config(hf: Any) -> dict:
    d_head = getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads
    return dict(
        decoder_config(hf, d_head),
        n_key_value_heads=hf.num_key_value_heads,
        eps=hf.norm_epsilon,
        normalization_type="LN",
        **rotary_config(hf, d_head),
        **local_attention(hf.sliding_window, [True] * hf.num_hidden_layers),
        default_prepend_bos=False,
        original_architecture="Starcoder2ForCausalLM",
    )


def convert_starcoder2_weights(hf_state: Mapping[str, torch.Tensor], cfg) -> dict[str, torch.Tensor]:
    hf = strip_prefix(hf_state, "model.")
    d = cfg.d_model
    sd = {"embed.W_E": hf["embed_tokens.weight"]}  # [d_vocab, d_model]
    for layer in range(cfg.n_layers):
        p = f"layers.{layer}."
        block = {
            **layer_norm(hf, p + "input_layernorm", "ln1", d),
            **projections(hf, p + "self_attn.", ("q_proj", "k_proj", "v_proj", "o_proj"), cfg),
            **layer_norm(hf, p + "post_attention_layernorm", "ln2", d),
            **dense_mlp(hf, p + "mlp.c_fc", p + "mlp.c_proj"),
        }
        sd.update(prefixed(f"blocks.{layer}.", block))
    sd.update(layer_norm(hf, "norm", "ln_final", d))
    sd.update(unembed_weights(hf.get("lm_head.weight"), sd["embed.W_E"]))
    return sd


register_architecture(("Starcoder2ForCausalLM",), convert_starcoder2_config, convert_starcoder2_weights)
