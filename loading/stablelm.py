"""StableLM-2 / StableLM-3B-4E1T (`StableLmForCausalLM`): LayerNorm, partial rotary, SwiGLU,
optional per-head qk LayerNorm and optional parallel block.

    per layer:  n = input_layernorm(x)
                x += attn(n); x += mlp(post_attention_layernorm(x))     (sequential)
             or x + attn(n) + mlp(n)                                   (use_parallel_residual: one norm)
    logits = lm_head(norm(x))

`qk_layernorm` (StableLM-2-12B) is one bias-free LayerNorm per head over d_head, stored as
`attn.q_norm.w` `[head, d_head]` (`k_norm`: `[kv_head, d_head]`). The StableLM-alpha models are
GPT-NeoX checkpoints.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from hooked.loading.common import strip_prefix, unembed_weights
from hooked.loading.llama import gated_mlp_weights
from hooked.loading.parts import (
    decoder_config,
    layer_norm,
    partial_rotary_dim,
    prefixed,
    projections,
    rotary_config,
    shared_layer_norm,
)
from hooked.loading.registry import register_architecture


def convert_stablelm_config(hf: Any) -> dict:
    d_head = hf.hidden_size // hf.num_attention_heads
    return dict(
        decoder_config(hf, d_head),
        n_key_value_heads=hf.num_key_value_heads,
        gated_mlp=True,
        eps=hf.layer_norm_eps,
        normalization_type="LN",
        **rotary_config(hf, partial_rotary_dim(hf, d_head)),
        parallel_attn_mlp=hf.use_parallel_residual,
        use_qk_norm=hf.qk_layernorm,
        qk_norm_per_head=hf.qk_layernorm,
        default_prepend_bos=False,
        original_architecture="StableLmForCausalLM",
    )


def per_head_norm(hf: Mapping[str, torch.Tensor], key: str, n_heads: int) -> torch.Tensor:
    """`StableLmLayerNormPerHead` (`norms.{h}.weight`, no bias) -> `[head, d_head]`."""
    return torch.stack([hf[f"{key}.norms.{h}.weight"] for h in range(n_heads)])


def convert_stablelm_weights(hf_state: Mapping[str, torch.Tensor], cfg) -> dict[str, torch.Tensor]:
    hf = strip_prefix(hf_state, "model.")
    d = cfg.d_model
    sd = {"embed.W_E": hf["embed_tokens.weight"]}  # [d_vocab, d_model]
    for layer in range(cfg.n_layers):
        p = f"layers.{layer}."
        if cfg.parallel_attn_mlp:
            norms = shared_layer_norm(hf, p + "input_layernorm", d)
        else:
            norms = {**layer_norm(hf, p + "input_layernorm", "ln1", d)}
            norms.update(layer_norm(hf, p + "post_attention_layernorm", "ln2", d))
        block = {
            **norms,
            **projections(hf, p + "self_attn.", ("q_proj", "k_proj", "v_proj", "o_proj"), cfg),
            **gated_mlp_weights(hf, p + "mlp.", cfg),
        }
        if cfg.use_qk_norm:
            for name, heads in (("q", cfg.n_heads), ("k", cfg.n_kv_heads)):
                w = per_head_norm(hf, p + f"self_attn.{name}_layernorm", heads)  # [heads, d_head]
                block[f"attn.{name}_norm.w"], block[f"attn.{name}_norm.b"] = w, torch.zeros_like(w)
        sd.update(prefixed(f"blocks.{layer}.", block))
    sd.update(layer_norm(hf, "norm", "ln_final", d))
    sd.update(unembed_weights(hf.get("lm_head.weight"), sd["embed.W_E"]))
    return sd


register_architecture(("StableLmForCausalLM",), convert_stablelm_config, convert_stablelm_weights)
