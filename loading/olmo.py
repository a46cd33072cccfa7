"""OLMo 1, 2 and 3 (`OlmoForCausalLM`, `Olmo2ForCausalLM`, `Olmo3ForCausalLM`): LLaMA-shaped weights, other norms.

| family | norms                                                          | attention extras                        |
|--------|----------------------------------------------------------------|-----------------------------------------|
| OLMo-1 | pre-norm LayerNorm **without parameters** (eps 1e-5) = `LNPre` | `clip_qkv` (after the projections)       |
| OLMo-2 | RMSNorm **after** each sublayer, none before (`PostNormBlock`) | qk RMSNorm over the full `H*dh` width    |
| OLMo-3 | as OLMo-2                                                      | sliding layers (`layer_types`), each layer type its own rope |

Weight processing: OLMo-1's norms are already parameter-free, so `fold_ln` only centers
the readers and `center_writing_weights` is exact (every reader is a LayerNorm).
OLMo-2/3 skip `fold_ln` and `center_writing_weights` with a warning: nothing reads a
normalized stream (see `components/post_norm_block.py`); the qk-norms are never folded.
"""  # noqa: E501 - a markdown table keeps each row on one line

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from hooked.loading.common import strip_prefix, unembed_weights
from hooked.loading.llama import (
    attention_weights,
    convert_llama_weights,
    gated_mlp_weights,
    llama_shaped_config,
    local_attention,
    qwen_local_layers,
)
from hooked.loading.registry import register_architecture


def convert_olmo_config(hf: Any) -> dict:
    return dict(
        llama_shaped_config(hf, "OlmoForCausalLM"),
        normalization_type="LNPre",
        eps=1e-5,  # OlmoLayerNorm's fixed eps
        clip_qkv=hf.clip_qkv,
        rotary_in_fp32=True,  # HF's OLMo keeps cos/sin in float32: q * cos promotes, then casts back
        rotary_tables_in_fp32=True,
        default_prepend_bos=True,
    )


def convert_olmo2_config(hf: Any, architecture: str = "Olmo2ForCausalLM") -> dict:
    return dict(
        llama_shaped_config(hf, architecture),
        post_sublayer_norm=True,
        use_qk_norm=True,
        full_width_qk_norm=True,
        norm_gain_in_fp32=True,  # (w * n32).to(dtype), as HF's Olmo2RMSNorm
        rotary_in_fp32=True,  # HF's OLMo keeps cos/sin in float32: q * cos promotes, then casts back
        rotary_tables_in_fp32=True,
        default_prepend_bos=True,
    )


def convert_olmo3_config(hf: Any) -> dict:
    window = getattr(hf, "sliding_window", None)
    return dict(
        convert_olmo2_config(hf, "Olmo3ForCausalLM"),
        **local_attention(window, qwen_local_layers(hf)),
    )


def convert_olmo2_weights(hf_state: Mapping[str, torch.Tensor], cfg) -> dict[str, torch.Tensor]:
    """OLMo-2/3: `post_attention_layernorm` -> `ln1`, `post_feedforward_layernorm` -> `ln2` (both post-sublayer)."""
    hf = strip_prefix(hf_state, "model.")
    sd = {"embed.W_E": hf["embed_tokens.weight"]}  # [d_vocab, d_model]
    for layer in range(cfg.n_layers):
        p, b = f"layers.{layer}.", f"blocks.{layer}."
        sd.update({b + k: v for k, v in attention_weights(hf, p + "self_attn.", cfg).items()})
        sd[b + "ln1.w"] = hf[p + "post_attention_layernorm.weight"]
        sd.update({b + k: v for k, v in gated_mlp_weights(hf, p + "mlp.", cfg).items()})
        sd[b + "ln2.w"] = hf[p + "post_feedforward_layernorm.weight"]
    sd["ln_final.w"] = hf["norm.weight"]
    sd.update(unembed_weights(hf.get("lm_head.weight"), sd["embed.W_E"]))
    return sd


register_architecture(("OlmoForCausalLM",), convert_olmo_config, convert_llama_weights)
register_architecture(("Olmo2ForCausalLM",), convert_olmo2_config, convert_olmo2_weights)
register_architecture(("Olmo3ForCausalLM",), convert_olmo3_config, convert_olmo2_weights)
