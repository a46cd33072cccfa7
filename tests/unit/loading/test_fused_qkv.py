"""Fused-QKV splitters (`loading/fused_qkv.py`) on plain tensors, against how HF splits the fused activations."""

from __future__ import annotations

import pytest
import torch

from hooked.loading.fused_qkv import split_qkv_blocks, split_qkv_interleaved

H, DH, D, B, P = 3, 4, 10, 2, 5


def fused_activations(n_out: int):
    w, b = torch.randn(n_out, D), torch.randn(n_out)
    x = torch.randn(B, P, D)
    return w, b, x, torch.nn.functional.linear(x, w, b)  # [batch, pos, n_out]


def split_apply(parts_w, parts_b, x):
    return [torch.nn.functional.linear(x, w, b) for w, b in zip(parts_w, parts_b, strict=True)]


def test_interleaved_matches_neox_view_and_chunk():
    w, b, x, fused = fused_activations(3 * H * DH)
    q, k, v = fused.view(B, P, H, 3 * DH).chunk(3, dim=-1)  # GPT-NeoX's attention
    ours = split_apply(split_qkv_interleaved(w, H, DH), split_qkv_interleaved(b, H, DH), x)
    for theirs, mine in zip((q, k, v), ours, strict=True):
        torch.testing.assert_close(mine.view(B, P, H, DH), theirs, atol=1e-6, rtol=0)


def test_interleaved_matches_bloom_three_axis_view():
    w, b, x, fused = fused_activations(3 * H * DH)
    per_head = fused.view(B, P, H, 3, DH)  # Bloom's _reshape
    ours = split_apply(split_qkv_interleaved(w, H, DH), split_qkv_interleaved(b, H, DH), x)
    for i, mine in enumerate(ours):
        torch.testing.assert_close(mine.view(B, P, H, DH), per_head[..., i, :], atol=1e-6, rtol=0)


@pytest.mark.parametrize("n_kv", [1, 3])
def test_blocks_match_bigcode_multi_query_split(n_kv):
    w, b, x, fused = fused_activations((H + 2 * n_kv) * DH)
    q, k, v = fused.split((H * DH, n_kv * DH, n_kv * DH), dim=-1)  # GPT-BigCode's multi_query path
    ours = split_apply(split_qkv_blocks(w, H, n_kv, DH), split_qkv_blocks(b, H, n_kv, DH), x)
    for theirs, mine in zip((q, k, v), ours, strict=True):
        torch.testing.assert_close(mine, theirs, atol=1e-6, rtol=0)


def test_blocks_reject_a_wrong_size():
    with pytest.raises(ValueError, match="expected 12 \\+ 4 \\+ 4"):
        split_qkv_blocks(torch.zeros(21, D), H, 1, DH)
