"""ALiBi (Bloom, Falcon, MPT): attention scores get a per-head linear bias by key position instead of position
embeddings.

`scores[b, h, i, j] = q_i . k_j / attn_scale + slope_h * pos_j`, with `pos_j` the position of
key j counted over real tokens only (`cumsum(mask) - 1`, as HuggingFace's
`build_alibi_tensor`), so a left-padded row gets the same biases as the prompt alone.
Biasing by the key position rather than the distance `pos_j - pos_i` changes every row by a
constant, which softmax ignores; it is what HF computes, so `hook_attn_scores` matches HF.

The bias is built once per forward (shared by every layer through `ForwardState.memo`) over
all keys, cached ones included, and is used by both attention paths: added to the scores
in the explicit path, and folded into a float mask for `scaled_dot_product_attention`.

MPT (`cfg.alibi_bias_max`) computes the same biases up to a constant per row, its own way:
slopes `2^(-alibi_bias_max * h / n)` over the next power of two `n >= n_heads` (interleaved
differently from Bloom's when `n_heads` is not a power of two), and the bias of key column j
is `slope * (j - last column)`, in float32 and by column (padding included), as HF's
`build_mpt_alibi_tensor`. Both are equal in softmax; building MPT's keeps half precision bit
for bit.
"""

from __future__ import annotations

import math

import torch
from jaxtyping import Float

from hooked.components.forward_state import ForwardState


def alibi_slopes(n_heads: int, bias_max: float | None = None) -> Float[torch.Tensor, "head"]:
    """HF's slopes: `2^(-8i/n)` for the largest power of two n <= n_heads, then every other
    slope of the next power of two for the remaining heads (Bloom); MPT's with `bias_max`."""
    if bias_max is not None:
        return mpt_alibi_slopes(n_heads, bias_max)
    closest = 2 ** math.floor(math.log2(n_heads))
    base = torch.tensor(2 ** (-(2 ** -(math.log2(closest) - 3))), dtype=torch.float32)
    slopes = base ** torch.arange(1, 1 + closest, dtype=torch.int32)
    if closest != n_heads:
        extra_base = torch.tensor(2 ** (-(2 ** -(math.log2(2 * closest) - 3))), dtype=torch.float32)
        n_extra = min(closest, n_heads - closest)
        slopes = torch.cat([slopes, extra_base ** torch.arange(1, 1 + 2 * n_extra, 2, dtype=torch.int32)])
    return slopes


def mpt_alibi_slopes(n_heads: int, bias_max: float) -> Float[torch.Tensor, "head"]:
    """MPT's slopes: `2^(-bias_max * h / n)`, h = 1..n, n the power of two at or above n_heads; for fewer
    heads than n, the odd-numbered slopes then the even-numbered ones, cut to n_heads (HF's order)."""
    n = 2 ** math.ceil(math.log2(n_heads))
    base = torch.arange(1, n + 1, dtype=torch.int64).float() * (bias_max / n)
    slopes = 1.0 / torch.pow(2, base)  # [n]
    if n != n_heads:
        slopes = torch.cat([slopes[1::2], slopes[::2]])[:n_heads]
    return slopes


def key_positions(state: ForwardState) -> Float[torch.Tensor, "batch n_keys"]:
    """Position of every key (cached and new), counting real tokens only; 0 at padding."""
    if state.attention_mask is None:
        return torch.arange(state.n_keys, device=state.positions.device)[None].float()  # [1, n_keys]
    mask = state.attention_mask
    return ((mask.cumsum(-1) - 1) * mask).float()  # [batch, n_keys]


def alibi_bias(
    state: ForwardState, slopes: Float[torch.Tensor, "head"], dtype: torch.dtype, from_last_key: bool = False
) -> Float[torch.Tensor, "batch head 1 n_keys"]:
    """`slope_h * pos_j`, cast to the activations' dtype as HF does; one table per forward call.

    `from_last_key` (MPT): `slope_h * (j - (n_keys - 1))` over key columns, kept in float32.
    """

    def build_from_last_key():
        columns = torch.arange(1 - state.n_keys, 1, dtype=torch.int32, device=state.positions.device)  # [n_keys]
        return (columns * slopes.to(columns.device)[:, None])[None, :, None, :]  # [1, head, 1, n_keys], float32

    def build():
        positions = key_positions(state)  # [batch, n_keys]
        bias = slopes.to(positions.device)[None, :, None] * positions[:, None, :]  # [batch, head, n_keys]
        return bias[:, :, None, :].to(dtype)  # [batch, head, 1, n_keys]

    if from_last_key:
        return state.memo(("alibi_from_last_key",), build_from_last_key)
    return state.memo(("alibi", dtype), build)


def alibi_sdpa_mask(
    state: ForwardState,
    slopes: Float[torch.Tensor, "head"],
    window: int | None,
    dtype: torch.dtype,
    from_last_key: bool = False,
) -> Float[torch.Tensor, "batch head n_queries n_keys"]:
    """The ALiBi bias with -inf at masked keys: an additive `attn_mask` for SDPA."""

    def build():
        bias = alibi_bias(state, slopes, dtype, from_last_key).to(dtype)  # [batch, head, 1, n_keys]
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
