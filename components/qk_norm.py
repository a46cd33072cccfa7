"""qk-norm: RMSNorm of the queries and keys after projection, before rotary.

Two widths exist. Qwen3 and Gemma-3 normalize each head over `d_head` (one gain of
`[d_head]` shared by all heads). OLMo-2/3 and OLMoE normalize the whole projection over
`n_heads * d_head` before the head split (gains `[n_heads * d_head]`, `[n_kv_heads * d_head]`);
their hooks see `[batch, pos, 1]` / `[batch, pos, n_heads * d_head]`.
"""

from __future__ import annotations

import torch
from jaxtyping import Float

from components.norms import RMSNorm


def apply_qk_norm(norm: RMSNorm, x: Float[torch.Tensor, "batch pos head d_head"]) -> torch.Tensor:
    """`norm` per head (`norm.length == d_head`) or over all heads at once (full width)."""
    if norm.length == x.shape[-1]:
        return norm(x)
    flat = x.flatten(-2)  # [batch, pos, head * d_head]
    if flat.shape[-1] == norm.length:
        return norm(flat).view_as(x)
    # Ungrouped keys (`ungroup_grouped_query_attention`): each K/V head appears `repeats` times in a row.
    # The mean square over the copies is that over the originals, so normalize the originals and repeat.
    repeats = flat.shape[-1] // norm.length
    unique = x.unflatten(-2, (-1, repeats))[..., 0, :]  # [batch, pos, kv_head, d_head]
    return norm(unique.flatten(-2)).view_as(unique).repeat_interleave(repeats, dim=-2)
