"""GPT-NeoX / Pythia (`GPTNeoXForCausalLM`): fused QKV interleaved per head, partial rotary, parallel block.

    per layer:  x + attn(ln1(x)) + mlp(ln2(x))         (use_parallel_residual, Pythia)
            or  x += attn(ln1(x)); x += mlp(ln2(x))
    logits = embed_out(final_layer_norm(x))

`query_key_value` rows are `[head, (q, k, v), d_head]`; rotary (NeoX half split) covers the
first `int(d_head * partial_rotary_factor)` dims (Pythia: 0.25); the unembedding is untied.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from hooked.loading.common import strip_prefix, unembed_weights
from hooked.loading.fused_qkv import split_qkv_interleaved
from hooked.loading.parts import (
    attention,
    decoder_config,
    dense_mlp,
    layer_norm,
    partial_rotary_dim,
    prefixed,
    rotary_config,
)
from hooked.loading.registry import register_architecture


def convert_gpt_neox_config(hf: Any) -> dict:
    d_head = hf.hidden_size // hf.num_attention_heads
    return dict(
        decoder_config(hf, d_head),
        eps=hf.layer_norm_eps,
        normalization_type="LN",
        **rotary_config(hf, partial_rotary_dim(hf, d_head)),
        parallel_attn_mlp=hf.use_parallel_residual,
        parallel_residual_last=True,
        default_prepend_bos=False,
        original_architecture="GPTNeoXForCausalLM",
    )


def convert_gpt_neox_weights(hf_state: Mapping[str, torch.Tensor], cfg) -> dict[str, torch.Tensor]:
    hf = strip_prefix(hf_state, "gpt_neox.")
    H, dh, d = cfg.n_heads, cfg.d_head, cfg.d_model
    sd = {"embed.W_E": hf["embed_in.weight"]}  # [d_vocab, d_model]
    for layer in range(cfg.n_layers):
        p = f"layers.{layer}."
        qkv = split_qkv_interleaved(hf[p + "attention.query_key_value.weight"], H, dh)  # 3 x [head * d_head, d_model]
        qkv_b = hf.get(p + "attention.query_key_value.bias")
        biases = (None,) * 3 if qkv_b is None else split_qkv_interleaved(qkv_b, H, dh)
        block = {
            **layer_norm(hf, p + "input_layernorm", "ln1", d),
            **attention(*qkv, hf[p + "attention.dense.weight"], (*biases, hf.get(p + "attention.dense.bias")), cfg),
            **layer_norm(hf, p + "post_attention_layernorm", "ln2", d),
            **dense_mlp(hf, p + "mlp.dense_h_to_4h", p + "mlp.dense_4h_to_h"),
        }
        sd.update(prefixed(f"blocks.{layer}.", block))
    sd.update(prefixed("", layer_norm(hf, "final_layer_norm", "ln_final", d)))
    lm_head = hf.get("lm_head.weight")  # transformers 5 in memory; Pythia checkpoints on disk say `embed_out`
    sd.update(unembed_weights(hf.get("embed_out.weight") if lm_head is None else lm_head, sd["embed.W_E"]))
    return sd


register_architecture(("GPTNeoXForCausalLM",), convert_gpt_neox_config, convert_gpt_neox_weights)
