"""Granite (`GraniteForCausalLM`): LLaMA plus four scalar multipliers, folded into the weights.

    x = embed_tokens(tokens) * embedding_multiplier     -> W_E * embed_scale
    scores = q k^T * attention_multiplier                -> attn_scale = 1 / attention_multiplier
    x = x + residual_multiplier * sublayer(x)            -> W_O, b_O, W_out, b_out * residual_scale
    logits = lm_head(norm(x)) / logits_scaling           -> W_U * logit_scale (= 1 / logits_scaling)

`embed_scale`, `residual_scale` and `logit_scale` are informational config fields: the
converter has already folded them, nothing multiplies at run time. Each fold changes
only the rounding of a product. Hook values follow the folded weights:
`hook_attn_out`/`hook_mlp_out` carry the residual multiplier (HF's sublayer outputs do
not) and `hook_embed` the embedding one. Folding the embedding or logit multiplier
unties tied embeddings.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from hooked.loading.llama import convert_llama_weights, llama_shaped_config
from hooked.loading.registry import register_architecture


def convert_granite_config(hf: Any) -> dict:
    return dict(
        llama_shaped_config(hf, "GraniteForCausalLM"),
        attn_scale=1.0 / hf.attention_multiplier,
        embed_scale=hf.embedding_multiplier,
        residual_scale=hf.residual_multiplier,
        logit_scale=1.0 / hf.logits_scaling,
        default_prepend_bos=False,
    )


def fold_scalar_multipliers(sd: dict[str, torch.Tensor], cfg) -> dict[str, torch.Tensor]:
    """Multiply `W_E` by `cfg.embed_scale`, every sublayer's output weights by `cfg.residual_scale`,
    `W_U` by `cfg.logit_scale`.

    New tensors are made (the inputs may be views of a user's HF model); a scale of None
    or 1 leaves its tensors, and a tied `W_U`, as they are.
    """

    def scale(keys: list[str], factor: float | None) -> None:
        if factor not in (None, 1.0):
            sd.update({k: sd[k] * factor for k in keys})

    scale(["embed.W_E"], cfg.embed_scale)
    writers = [
        f"blocks.{layer}.{name}"
        for layer in range(cfg.n_layers)
        for name in ("attn.W_O", "attn.b_O", "mlp.W_out", "mlp.b_out")
    ]
    scale(writers, cfg.residual_scale)
    scale(["unembed.W_U", "unembed.b_U"], cfg.logit_scale)
    return sd


def convert_granite_weights(hf_state: Mapping[str, torch.Tensor], cfg) -> dict[str, torch.Tensor]:
    return fold_scalar_multipliers(convert_llama_weights(hf_state, cfg), cfg)


register_architecture(("GraniteForCausalLM",), convert_granite_config, convert_granite_weights)
