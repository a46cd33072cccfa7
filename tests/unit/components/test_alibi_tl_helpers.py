"""TransformerLens's static ALiBi helpers on Attention agree with hooked's ALiBi."""

from __future__ import annotations

import pytest
import torch

from hooked.components import Attention
from hooked.components.alibi import alibi_slopes


def test_slope_is_minus_distance_below_the_diagonal():
    slope = Attention.create_alibi_slope(5)
    expected = torch.tensor([[min(j - i, 0) for j in range(5)] for i in range(5)], dtype=torch.float32)
    torch.testing.assert_close(slope, expected, rtol=0, atol=0)


@pytest.mark.parametrize("n_heads", [1, 2, 8, 16])
def test_multipliers_are_hf_slopes_for_powers_of_two(n_heads):
    torch.testing.assert_close(Attention.create_alibi_multipliers(n_heads), alibi_slopes(n_heads))


def test_distance_bias_gives_hf_key_position_attention_pattern():
    """Bias by distance (TL) and by key position (HF) differ by a per-row constant: same softmax."""
    n_heads, n_ctx = 4, 6
    scores = torch.randn(n_heads, n_ctx, n_ctx)
    causal = torch.ones(n_ctx, n_ctx, dtype=torch.bool).tril()
    by_distance = scores + Attention.create_alibi_bias(n_heads, n_ctx)
    by_key = scores + alibi_slopes(n_heads)[:, None, None] * torch.arange(n_ctx).float()
    pattern = [s.masked_fill(~causal, float("-inf")).softmax(-1) for s in (by_distance, by_key)]
    torch.testing.assert_close(pattern[0], pattern[1], rtol=0, atol=1e-6)
