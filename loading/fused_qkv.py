"""Splitting fused query/key/value projections into separate HF-layout `[out, in]` weights.

HF checkpoints fuse q, k and v into one `Linear` in two layouts:

* **interleaved per head** (GPT-NeoX, Bloom, multi-head GPT-BigCode): the output axis is
  `[head, (q, k, v), d_head]`, so head h's query rows are followed by its key and value rows;
* **blocks** (multi-query GPT-BigCode, Phi-3, Falcon-MQA): `[Q; K; V]` with sizes
  `n_heads * d_head`, `n_kv_heads * d_head`, `n_kv_heads * d_head`.

Both functions take the fused weight `[fused_out, d_model]` (or bias `[fused_out]`) and return
three tensors in the unfused HF layout (`[heads * d_head, d_model]` / `[heads * d_head]`), so the
shared per-head converters (`heads_in`) apply unchanged. Weight and bias are split the same way
because only the output axis (the first) is touched.
"""

from __future__ import annotations

import torch
from jaxtyping import Float


def split_qkv_interleaved(
    fused: Float[torch.Tensor, "fused_out *d_in"], n_heads: int, d_head: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`[head * 3 * d_head, ...]` laid out `[head, (q, k, v), d_head]` -> q, k, v each `[head * d_head, ...]`."""
    rest = fused.shape[1:]
    per_head = fused.reshape(n_heads, 3, d_head, *rest)  # [head, qkv, d_head, ...]
    q, k, v = (per_head[:, i].reshape(n_heads * d_head, *rest) for i in range(3))
    return q, k, v


def split_qkv_blocks(
    fused: Float[torch.Tensor, "fused_out *d_in"], n_heads: int, n_kv_heads: int, d_head: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`[Q; K; V]` stacked on the output axis -> q `[head * d_head, ...]`, k and v `[kv_head * d_head, ...]`."""
    sizes = [n_heads * d_head, n_kv_heads * d_head, n_kv_heads * d_head]
    if fused.shape[0] != sum(sizes):
        raise ValueError(f"Fused QKV has {fused.shape[0]} output rows; expected {' + '.join(map(str, sizes))}")
    q, k, v = fused.split(sizes, dim=0)
    return q, k, v
