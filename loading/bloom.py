"""Bloom (`BloomForCausalLM`): ALiBi instead of positions, a LayerNorm right after the embedding,
fused QKV interleaved per head.

    x = word_embeddings_layernorm(word_embeddings(tokens))      -> embed.ln
    per layer:  x += attn(input_layernorm(x));  x += mlp(post_attention_layernorm(x))
    scores = q.k / sqrt(d_head) + slope_h * key_position        (components/alibi.py)
    logits = word_embeddings^T ln_f(x)                          (tied)

`query_key_value` rows are `[head, (q, k, v), d_head]`. Bloom's gelu is the tanh approximation
(`gelu_bloom`: `gelu_fast`'s formula in another op order). ALiBi needs no position table, so
`n_ctx` is only the training length.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from hooked.loading.common import strip_prefix, unembed_weights
from hooked.loading.config_checks import require_supported
from hooked.loading.fused_qkv import split_qkv_interleaved
from hooked.loading.parts import attention, dense_mlp, layer_norm, prefixed
from hooked.loading.registry import register_architecture


def convert_bloom_config(hf: Any) -> dict:
    require_supported(  # True takes the residual after the norm; released checkpoints use False
        hf, "Bloom", "apply_residual_connection_post_layernorm", (False,)
    )
    return dict(
        d_model=hf.hidden_size,
        d_head=hf.hidden_size // hf.n_head,
        n_heads=hf.n_head,
        n_layers=hf.n_layer,
        n_ctx=getattr(hf, "seq_length", None) or 2048,
        d_mlp=4 * hf.hidden_size,
        d_vocab=hf.vocab_size,
        act_fn="gelu_bloom",
        eps=hf.layer_norm_epsilon,
        normalization_type="LN",
        positional_embedding_type="alibi",
        post_embedding_ln=True,
        default_prepend_bos=False,
        original_architecture="BloomForCausalLM",
    )


def convert_bloom_weights(hf_state: Mapping[str, torch.Tensor], cfg) -> dict[str, torch.Tensor]:
    hf = strip_prefix(hf_state, "transformer.")
    H, dh, d = cfg.n_heads, cfg.d_head, cfg.d_model
    sd = {"embed.W_E": hf["word_embeddings.weight"]}  # [d_vocab, d_model]
    sd.update(layer_norm(hf, "word_embeddings_layernorm", "embed.ln", d))
    for layer in range(cfg.n_layers):
        p = f"h.{layer}.self_attention."
        qkv = split_qkv_interleaved(hf[p + "query_key_value.weight"], H, dh)  # 3 x [head * d_head, d_model]
        qkv_b = split_qkv_interleaved(hf[p + "query_key_value.bias"], H, dh)  # 3 x [head * d_head]
        block = {
            **layer_norm(hf, f"h.{layer}.input_layernorm", "ln1", d),
            **attention(*qkv, hf[p + "dense.weight"], (*qkv_b, hf.get(p + "dense.bias")), cfg),
            **layer_norm(hf, f"h.{layer}.post_attention_layernorm", "ln2", d),
            **dense_mlp(hf, f"h.{layer}.mlp.dense_h_to_4h", f"h.{layer}.mlp.dense_4h_to_h"),
        }
        sd.update(prefixed(f"blocks.{layer}.", block))
    sd.update(layer_norm(hf, "ln_f", "ln_final", d))
    sd.update(unembed_weights(hf.get("lm_head.weight"), sd["embed.W_E"]))
    return sd


register_architecture(("BloomForCausalLM",), convert_bloom_config, convert_bloom_weights)
