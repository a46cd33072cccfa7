"""XGLM (`XGLMForCausalLM`): fixed sinusoidal positions at an offset of 2, embeddings scaled by sqrt(d_model).

    x = embed_tokens(tokens) * sqrt(d_model) + sinusoid(positions + 2)
    per layer:  x += out_proj(attn(self_attn_layer_norm(x)));  x += fc2(gelu(fc1(final_layer_norm(x))))
    logits = embed_tokens^T layer_norm(x)                            (tied, unscaled)

The sinusoidal table is fairseq's (sin of every frequency, then cos; frequencies
`10000^(-i / (d/2 - 1))`), built by HF on the fly and never stored: the converter builds
it the same way, and `W_pos` is its rows from the offset on (a fixed table, loaded as a
learned one). `W_E` holds the embedding times its scale (as HF multiplies in the model's
dtype); a tied `W_U` keeps the unscaled embedding. HF multiplies q by 1/sqrt(d_head) before
QK^T; hooked scales the scores, the same product.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from jaxtyping import Float

from hooked.loading.common import strip_prefix, unembed_weights
from hooked.loading.config_checks import require_activation, require_supported
from hooked.loading.parts import dense_mlp, layer_norm, prefixed, projections
from hooked.loading.registry import register_architecture

#: HF's `XGLMSinusoidalPositionalEmbedding.offset`: position p reads row p + 2
POSITION_OFFSET = 2


def convert_xglm_config(hf: Any) -> dict:
    require_supported(hf, "XGLM", "add_cross_attention", (False,), default=False)
    # HF zeroes row `pad_token_id` of its position table: inside the table's used rows, that zeroes a position
    require_supported(
        hf, "XGLM", "pad_token_id", lambda pad: pad is None or pad < POSITION_OFFSET, describe="a pad id below 2"
    )
    return dict(
        d_model=hf.d_model,
        d_head=hf.d_model // hf.attention_heads,
        n_heads=hf.attention_heads,
        n_layers=hf.num_layers,
        n_ctx=hf.max_position_embeddings,
        d_mlp=hf.ffn_dim,
        d_vocab=hf.vocab_size,
        act_fn=require_activation(hf, "activation_function"),
        eps=1e-5,  # nn.LayerNorm's default: XGLM's config has no eps
        normalization_type="LN",
        positional_embedding_type="standard",
        embed_scale=math.sqrt(hf.d_model) if hf.scale_embedding else None,
        default_prepend_bos=True,
        original_architecture="XGLMForCausalLM",
    )


def sinusoidal_positions(
    n_positions: int, d_model: int, padding_idx: int | None = None
) -> Float[torch.Tensor, "n d_model"]:
    """fairseq's sinusoidal table `[n_positions, d_model]`, as HF's XGLM builds it (float32, padding row 0)."""
    half = d_model // 2
    step = math.log(10000) / (half - 1)
    freqs = torch.exp(torch.arange(half, dtype=torch.int64).float() * -step)  # [half]
    angles = torch.arange(n_positions, dtype=torch.int64).float()[:, None] * freqs[None]  # [n, half]
    table = torch.cat([torch.sin(angles), torch.cos(angles)], dim=1)  # [n, 2 * half]
    if d_model % 2:
        table = torch.cat([table, torch.zeros(n_positions, 1)], dim=1)
    if padding_idx is not None:
        table[padding_idx] = 0
    return table


def scaled_embedding(embed: torch.Tensor, scale: float | None, dtype: torch.dtype) -> torch.Tensor:
    """`embed * scale` as HF's XGLM computes it in `dtype` (a Python scalar: the product rounded once)."""
    if scale is None:
        return embed
    product = (embed.to(dtype).float() * scale).to(dtype)  # [d_vocab, d_model]
    return product.to(torch.promote_types(embed.dtype, dtype))


def convert_xglm_weights(hf_state: Mapping[str, torch.Tensor], cfg) -> dict[str, torch.Tensor]:
    hf = strip_prefix(hf_state, "model.")
    d = cfg.d_model
    embed = hf["embed_tokens.weight"]  # [d_vocab, d_model]
    table = sinusoidal_positions(cfg.n_ctx + POSITION_OFFSET, d, None)  # (a pad id below 2: config check)
    sd = {
        "embed.W_E": scaled_embedding(embed, cfg.embed_scale, cfg.dtype),
        "pos_embed.W_pos": table[POSITION_OFFSET:].to(embed.dtype),  # [n_ctx, d_model]
    }
    for layer in range(cfg.n_layers):
        p = f"layers.{layer}."
        block = {
            **layer_norm(hf, p + "self_attn_layer_norm", "ln1", d),
            **projections(hf, p + "self_attn.", ("q_proj", "k_proj", "v_proj", "out_proj"), cfg),
            **layer_norm(hf, p + "final_layer_norm", "ln2", d),
            **dense_mlp(hf, p + "fc1", p + "fc2"),
        }
        sd.update(prefixed(f"blocks.{layer}.", block))
    sd.update(layer_norm(hf, "layer_norm", "ln_final", d))
    sd.update(unembed_weights(hf.get("lm_head.weight"), embed))
    return sd


register_architecture(("XGLMForCausalLM",), convert_xglm_config, convert_xglm_weights)
