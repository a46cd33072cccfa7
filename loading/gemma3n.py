"""Gemma 3n (`Gemma3nForCausalLM`, text): Gemma 4's attention and per-layer inputs inside AltUp streams.

    x = altup_expand(embed_tokens(tokens) * sqrt(d_model))             [b, p, stream, d_model]
    per layer:  Gemma3nBlock: predict, attention + LAuReL, MLP (sparse gate on the first layers),
                correct, per-layer input                              (`components/gemma3n_block.py`)
    logits = soft_cap(lm_head(norm(altup_collapse(x))))

Shared with Gemma 4 (`loading/gemma4.py`): norms multiplying by `w` in float32, per-head q/k/v
norms (the value norm without a gain), scaling 1, sliding and global layers each with its rope,
KV sharing of the last `num_kv_shared_layers` layers, per-layer inputs. Its own: AltUp
(`components/altup.py`), LAuReL (`components/laurel.py`), the Gaussian top-k of
`activation_sparsity_pattern` (`components/activation_sparsity.py`) and a per-layer
`intermediate_size`.

HF multiplies by the per-layer projection and combination scales as 0-d buffers cast to the model
dtype (Gemma 4: Python floats): `per_layer_scales_in_dtype`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from hooked.loading.common import strip_prefix, unembed_weights
from hooked.loading.config_checks import require_rope_types
from hooked.loading.gemma import scaled_embedding
from hooked.loading.gemma4 import (
    block_norms_and_mlp,
    decoder_prefix,
    gemma_ple_config,
    per_layer_embed_weights,
    ple_attention_weights,
    text_config,
)
from hooked.loading.registry import register_architecture

ROPE_TYPES = ("default", "linear", "llama3", "yarn")


def convert_gemma3n_config(hf: Any) -> dict:
    text = text_config(hf)
    for layer_type in sorted(set(text.layer_types)):
        require_rope_types(text, "Gemma 3n", ROPE_TYPES, layer_type=layer_type)
    sizes = list(text.intermediate_size)  # HF's config keeps one per layer
    sparsity = [float(s) for s in text.activation_sparsity_pattern]
    return dict(
        gemma_ple_config(text, "Gemma3nForCausalLM"),
        d_mlp=sizes[0],
        layer_d_mlp=sizes,
        activation_sparsity=sparsity if any(sparsity) else None,
        altup_num_inputs=text.altup_num_inputs,
        altup_active_idx=text.altup_active_idx,
        altup_correct_scale=text.altup_correct_scale,
        laurel_rank=text.laurel_rank,
        per_layer_scales_in_dtype=True,  # HF's 0-d buffers, cast to the model dtype
    )


def _altup_block(hf: Mapping[str, torch.Tensor], p: str) -> dict[str, torch.Tensor]:
    """A layer's AltUp and LAuReL, TransformerLens-style right-multiplying weights."""
    return {
        "altup.W_router": hf[p + "altup.modality_router.weight"].T,  # [d_model, stream]
        "altup.router_norm.w": hf[p + "altup.router_norm.weight"],
        "altup.W_prediction": hf[p + "altup.prediction_coefs.weight"].T,  # [stream, stream * stream]
        "altup.W_correction": hf[p + "altup.correction_coefs.weight"].T,  # [stream, stream]
        "altup.correct_output_scale": hf[p + "altup.correct_output_scale"],  # [d_model]
        "laurel.W_left": hf[p + "laurel.linear_left.weight"].T,  # [d_model, rank]
        "laurel.W_right": hf[p + "laurel.linear_right.weight"].T,  # [rank, d_model]
        "laurel.ln.w": hf[p + "laurel.post_laurel_norm.weight"],
    }


def convert_gemma3n_weights(hf_state: Mapping[str, torch.Tensor], cfg) -> dict[str, torch.Tensor]:
    hf = strip_prefix(hf_state, decoder_prefix(hf_state))
    embed = hf["embed_tokens.weight"]  # [d_vocab, d_model]
    sd = {"embed.W_E": scaled_embedding(embed, cfg.embed_scale, cfg.dtype), **per_layer_embed_weights(hf, cfg)}
    n = cfg.altup_num_inputs - 1
    # [stream - 1, d_model, d_model] views of HF's stacked `[out, in]` weights: each matmul reads HF's layout
    sd["altup_streams.W_up"] = torch.stack([hf[f"altup_projections.{i}.weight"] for i in range(n)]).mT
    sd["altup_streams.W_down"] = torch.stack([hf[f"altup_unembed_projections.{i}.weight"] for i in range(n)]).mT
    for layer in range(cfg.n_layers):
        p, layer_cfg = f"layers.{layer}.", cfg.layer_config(layer)
        block = ple_attention_weights(hf, p + "self_attn.", layer_cfg, cfg.kv_source(layer) is not None)
        block.update(block_norms_and_mlp(hf, p, layer_cfg))
        block.update(_altup_block(hf, p))
        sd.update({f"blocks.{layer}.{k}": v for k, v in block.items()})
    sd["ln_final.w"] = hf["norm.weight"]
    lm_head = hf_state.get("lm_head.weight", hf_state.get("language_model.lm_head.weight"))
    sd.update(unembed_weights(lm_head, embed))  # tied: W_U is the unscaled embedding
    return sd


register_architecture(("Gemma3nForCausalLM",), convert_gemma3n_config, convert_gemma3n_weights)
