"""GPT-BigCode / SantaCoder / StarCoder-1 (`GPTBigCodeForCausalLM`): GPT-2 shape with
multi-query attention and `nn.Linear` (not Conv1D) weights.

    x = wte(tokens) + wpe(positions)
    per layer:  x += attn(ln_1(x));  x += mlp(ln_2(x))
    logits = wte^T ln_f(x)             (tied)

`c_attn` is `[Q; K; V]` blocks with one K/V head under `multi_query` (the default), else
`[head, (q, k, v), d_head]` interleaved per head.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from hooked.loading.common import ACT_FN_NAMES, strip_prefix, unembed_weights  # noqa: F401  (ACT_FN_NAMES: importable from here before)
from hooked.loading.config_checks import require_activation
from hooked.loading.fused_qkv import split_qkv_blocks, split_qkv_interleaved
from hooked.loading.parts import attention, dense_mlp, layer_norm, prefixed
from hooked.loading.registry import register_architecture


def convert_gpt_bigcode_config(hf: Any) -> dict:
    return dict(
        d_model=hf.n_embd,
        d_head=hf.n_embd // hf.n_head,
        n_heads=hf.n_head,
        n_key_value_heads=1 if hf.multi_query else hf.n_head,
        n_layers=hf.n_layer,
        n_ctx=hf.n_positions,
        d_mlp=hf.n_inner or 4 * hf.n_embd,
        d_vocab=hf.vocab_size,
        act_fn=require_activation(hf, "activation_function"),
        eps=hf.layer_norm_epsilon,
        normalization_type="LN",
        positional_embedding_type="standard",
        use_attn_scale=hf.scale_attn_weights,
        default_prepend_bos=False,
        original_architecture="GPTBigCodeForCausalLM",
    )


def _split(fused: torch.Tensor, cfg) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if cfg.uses_grouped_query_attention:  # multi-query
        return split_qkv_blocks(fused, cfg.n_heads, cfg.n_kv_heads, cfg.d_head)
    return split_qkv_interleaved(fused, cfg.n_heads, cfg.d_head)


def convert_gpt_bigcode_weights(hf_state: Mapping[str, torch.Tensor], cfg) -> dict[str, torch.Tensor]:
    hf = strip_prefix(hf_state, "transformer.")
    d = cfg.d_model
    sd = {"embed.W_E": hf["wte.weight"], "pos_embed.W_pos": hf["wpe.weight"]}
    for layer in range(cfg.n_layers):
        p = f"h.{layer}."
        qkv = _split(hf[p + "attn.c_attn.weight"], cfg)  # q [head * d_head, d_model], k/v [kv_head * d_head, d_model]
        qkv_b = _split(hf[p + "attn.c_attn.bias"], cfg)
        block = {
            **layer_norm(hf, p + "ln_1", "ln1", d),
            **attention(*qkv, hf[p + "attn.c_proj.weight"], (*qkv_b, hf.get(p + "attn.c_proj.bias")), cfg),
            **layer_norm(hf, p + "ln_2", "ln2", d),
            **dense_mlp(hf, p + "mlp.c_fc", p + "mlp.c_proj"),
        }
        sd.update(prefixed(f"blocks.{layer}.", block))
    sd.update(layer_norm(hf, "ln_f", "ln_final", d))
    sd.update(unembed_weights(hf.get("lm_head.weight"), sd["embed.W_E"]))
    return sd


register_architecture(("GPTBigCodeForCausalLM",), convert_gpt_bigcode_config, convert_gpt_bigcode_weights)
