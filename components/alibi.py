"""ALiBi (Bloom): attention scores get a per-head linear bias by key position instead of position embeddings.

`scores[b, h, i, j] = q_i . k_j / attn_scale + slope_h * pos_j`, with `pos_j` the position of
key j counted over real tokens only (`cumsum(mask) - 1`, as HuggingFace's
`build_alibi_tensor`), so a left-padded row gets the same biases as the prompt alone.
Biasing by the key position rather than the distance `pos_j - pos_i` changes every row by a
constant, which softmax ignores; it is what HF computes, so `hook_attn_scores` matches HF.

The bias is built once per forward (shared by every layer through `ForwardState.memo`) over
all keys, cached ones included, and is used by both attention paths: added to the scores
in the explicit path, and folded into a float mask for `scaled_dot_product_attention`.
"""

from __future__ import annotations

import math

import torch
from jaxtyping import Float

from hooked.components.forward_state import ForwardState


def alibi_slopes(n_heads: int) -> Float[torch.Tensor, "head"]:
    """HF's slopes: `2^(-8i/n)` for the largest power of two n <= n_heads, then every other
    slope of the next power of two for the remaining heads."""
    closest = 2 ** math.floor(math.log2(n_heads))
    base = torch.tensor(2 ** (-(2 ** -(math.log2(closest) - 3))), dtype=torch.float32)
    slopes = base ** torch.arange(1, 1 + closest, dtype=torch.int32)
    if closest != n_heads:
        extra_base = torch.tensor(2 ** (-(2 ** -(math.log2(2 * closest) - 3))), dtype=torch.float32)
        n_extra = min(closest, n_heads - closest)
        slopes = torch.cat([slopes, extra_base ** torch.arange(1, 1 + 2 * n_extra, 2, dtype=torch.int32)])
    return slopes


def key_positions(state: ForwardState) -> Float[torch.Tensor, "batch n_keys"]:
    """Position of every key (cached and new), counting real tokens only; 0 at padding."""
    if state.attention_mask is None:
        return torch.arange(state.n_keys, device=state.positions.device)[None].float()  # [1, n_keys]
    mask = state.attention_mask
    return ((mask.cumsum(-1) - 1) * mask).float()  # [batch, n_keys]


def alibi_bias(
    state: ForwardState, slopes: Float[torch.Tensor, "head"], dtype: torch.dtype
) -> Float[torch.Tensor, "batch head 1 n_keys"]:
    """`slope_h * pos_j`, cast to the activations' dtype as HF does; one table per forward call."""

    def build():
        positions = key_positions(state)  # [batch, n_keys]
        bias = slopes.to(positions.device)[None, :, None] * positions[:, None, :]  # [batch, head, n_keys]
        return bias[:, :, None, :].to(dtype)  # [batch, head, 1, n_keys]

    return state.memo(("alibi", dtype), build)


def alibi_sdpa_mask(
    state: ForwardState, slopes: Float[torch.Tensor, "head"], window: int | None, dtype: torch.dtype
) -> Float[torch.Tensor, "batch head n_queries n_keys"]:
    """The ALiBi bias with -inf at masked keys: an additive `attn_mask` for SDPA."""

    def build():
        bias = alibi_bias(state, slopes, dtype)  # [batch, head, 1, n_keys]
        allowed = state.allowed(window)  # [batch or 1, 1, n_queries, n_keys] or None
        if allowed is None:
            return bias
        return torch.where(allowed, bias, float("-inf"))  # [batch, head, n_queries, n_keys]

    return state.memo(("alibi_sdpa", window, dtype), build)


# -- TransformerLens's static ALiBi helpers (`AbstractAttention.create_alibi_*`) ----------


def create_alibi_slope(n_ctx: int, device=None) -> Float[torch.Tensor, "query key"]:
    """`min(key - query, 0)`: 0 on and above the diagonal, -distance below it."""
    positions = torch.arange(n_ctx, device=device)
    return (positions[None, :] - positions[:, None]).clamp(max=0).float()  # [query, key]


def create_alibi_multipliers(n_heads: int, device=None) -> Float[torch.Tensor, "head"]:
    """TransformerLens's geometric slopes `2^(-8h/n)`, h = 1..n (HF's `alibi_slopes` for 2^k heads)."""
    return (2 ** (-8 / n_heads)) ** torch.arange(1, n_heads + 1, device=device)


def create_alibi_bias(n_heads: int, n_ctx: int, device=None) -> Float[torch.Tensor, "head query key"]:
    """Per-head distance bias `multiplier_h * min(key - query, 0)` over an `n_ctx` square."""
    slope = create_alibi_slope(n_ctx, device)  # [query, key]
    return create_alibi_multipliers(n_heads, device)[:, None, None] * slope  # [head, query, key]
