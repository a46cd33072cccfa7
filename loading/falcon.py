"""Falcon (`FalconForCausalLM`): parallel or sequential blocks, three fused-QKV layouts, rotary.

| variant                                   | fused `query_key_value` rows                | K/V heads | norms                                   |
|-------------------------------------------|---------------------------------------------|-----------|-----------------------------------------|
| `new_decoder_architecture` (40B/180B)     | `[kv, (H/kv queries, k, v), d_head]` grouped | `num_kv_heads` | `ln_attn` + `ln_mlp`, or one shared (`num_ln_in_parallel_attn` 1) |
| `multi_query` (7B)                         | `[Q; K; V]` blocks (= grouped with kv 1)     | 1         | `input_layernorm`, shared (parallel)     |
| neither                                    | `[head, (q, k, v), d_head]` (= grouped, kv H) | H         | `input_layernorm` (+ `post_attention_layernorm` unless parallel) |

LayerNorms with bias, a dense MLP (`activation`, GELU by default), biases when `bias`,
NeoX half-split rotary over the whole head, or ALiBi (falcon-rw, `alibi=True`), whose
bias HF adds **before** the 1/sqrt(d_head) scaling (`cfg.alibi_before_attn_scale`: the
slopes are scaled instead). The new architecture is always parallel. HF's eager softmax
runs in the hidden dtype (float32 here, so exact).
"""  # noqa: E501 - a markdown table keeps each row on one line

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from hooked.loading.common import ACT_FN_NAMES, hf_rope_parameters, strip_prefix, unembed_weights  # noqa: F401  (ACT_FN_NAMES: importable from here before)
from hooked.loading.config_checks import require_activation
from hooked.loading.parts import attention, dense_mlp, layer_norm, prefixed, shared_layer_norm
from hooked.loading.registry import register_architecture


def _kv_heads(hf: Any) -> int:
    if hf.new_decoder_architecture:
        return hf.num_kv_heads
    return 1 if hf.multi_query else hf.num_attention_heads


def _parallel(hf: Any) -> bool:
    return bool(hf.new_decoder_architecture or hf.parallel_attn)


def _shared_norm(hf: Any) -> bool:
    """One LayerNorm read by both sublayers (else `ln_attn`/`ln_mlp` or a sequential block's two)."""
    if hf.new_decoder_architecture:
        return (hf.num_ln_in_parallel_attn or 2) == 1
    return bool(hf.parallel_attn)


def convert_falcon_config(hf: Any) -> dict:
    d_head = hf.hidden_size // hf.num_attention_heads
    rotary_base, rotary_scaling = hf_rope_parameters(hf)
    return dict(
        d_model=hf.hidden_size,
        d_head=d_head,
        n_heads=hf.num_attention_heads,
        n_key_value_heads=_kv_heads(hf),
        n_layers=hf.num_hidden_layers,
        n_ctx=hf.max_position_embeddings,
        d_mlp=hf.ffn_hidden_size,
        d_vocab=hf.vocab_size,
        act_fn=require_activation(hf, "activation"),
        eps=hf.layer_norm_epsilon,
        normalization_type="LN",
        positional_embedding_type="alibi" if hf.alibi else "rotary",
        alibi_before_attn_scale=bool(hf.alibi),  # falcon-rw: (q.k + alibi) / sqrt(d_head)
        rotary_dim=d_head,
        rotary_base=rotary_base,
        rotary_scaling=rotary_scaling,
        parallel_attn_mlp=_parallel(hf),
        bias_after_matmul=True,  # FalconLinear: x @ W.T, then + bias
        attn_scale_divides=not hf.alibi,  # rotary: scores /= sqrt(d_head); ALiBi: *= 1/sqrt(d_head) in fp32
        parallel_residual_last=True,
        original_architecture="FalconForCausalLM",
        default_prepend_bos=False,
    )


def split_falcon_qkv(fused: torch.Tensor, cfg) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Falcon's fused rows `[kv_head, (H/kv queries, k, v), d_head]` -> q `[H*dh, ...]`, k, v `[Hkv*dh, ...]` (views).

    One grouped layout covers all three variants: with one K/V head it is the `[Q; K; V]`
    blocks of multi-query Falcon, with H it is the per-head interleaving `[head, 3, d_head]`.
    """
    H, Hkv, dh = cfg.n_heads, cfg.n_kv_heads, cfg.d_head
    rest = fused.shape[1:]
    groups = fused.reshape(Hkv, H // Hkv + 2, dh, *rest)  # [kv_head, queries + k + v, d_head, ...]
    q = groups[:, :-2].reshape(H * dh, *rest)  # query head g * (H/kv) + i, as HF's flatten
    return q, groups[:, -2].reshape(Hkv * dh, *rest), groups[:, -1].reshape(Hkv * dh, *rest)


def convert_falcon_weights(hf_state: Mapping[str, torch.Tensor], cfg) -> dict[str, torch.Tensor]:
    hf = strip_prefix(hf_state, "transformer.")
    sd = {"embed.W_E": hf["word_embeddings.weight"]}  # [d_vocab, d_model]
    d = cfg.d_model
    for layer in range(cfg.n_layers):
        p, b = f"h.{layer}.", f"blocks.{layer}."
        if p + "ln_attn.weight" in hf:  # new architecture, two norms
            norms = {**layer_norm(hf, p + "ln_attn", "ln1", d), **layer_norm(hf, p + "ln_mlp", "ln2", d)}
        elif cfg.parallel_attn_mlp:  # one norm read by both sublayers
            norms = shared_layer_norm(hf, p + "input_layernorm", d)
        else:
            norms = {
                **layer_norm(hf, p + "input_layernorm", "ln1", d),
                **layer_norm(hf, p + "post_attention_layernorm", "ln2", d),
            }
        sd.update(prefixed(b, norms))
        a = p + "self_attention."
        w = hf[a + "query_key_value.weight"]  # [fused_out, d_model]
        bias = hf.get(a + "query_key_value.bias")
        q, k, v = split_falcon_qkv(w, cfg)
        qkv_biases = (None,) * 3 if bias is None else split_falcon_qkv(bias, cfg)
        o = hf[a + "dense.weight"]  # [d_model, head * d_head]
        sd.update(prefixed(b, attention(q, k, v, o, (*qkv_biases, hf.get(a + "dense.bias")), cfg)))
        sd.update(prefixed(b, dense_mlp(hf, p + "mlp.dense_h_to_4h", p + "mlp.dense_4h_to_h")))
    sd.update(layer_norm(hf, "ln_f", "ln_final", d))
    sd.update(unembed_weights(hf.get("lm_head.weight"), sd["embed.W_E"]))
    return sd


register_architecture(("FalconForCausalLM",), convert_falcon_config, convert_falcon_weights)
