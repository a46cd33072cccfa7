"""Unembed: the vocabulary projection is exact in both orientations and for both layouts."""

import pytest
import torch

from hooked.components.unembed import Unembed, vocab_projection
from hooked.core.config import HookedTransformerConfig


@pytest.mark.parametrize("rows", [1, 2, 5, 20])
@pytest.mark.parametrize("vocab_major", [True, False])
def test_vocab_projection_matches_matmul(rows, vocab_major):
    torch.manual_seed(0)
    x = torch.randn(rows, 16, dtype=torch.float64)
    W_U = torch.randn(50, 16, dtype=torch.float64).T if vocab_major else torch.randn(16, 50, dtype=torch.float64)
    out = vocab_projection(x, W_U)
    assert out.is_contiguous() and out.shape == (rows, 50)
    torch.testing.assert_close(out, x @ W_U, atol=1e-12, rtol=0)


def test_unembed_stores_W_U_vocab_major_and_adds_bias():
    cfg = HookedTransformerConfig(n_layers=1, d_model=16, n_ctx=8, d_head=4, d_vocab=50, act_fn="relu")
    unembed = Unembed(cfg)
    assert unembed.W_U.shape == (16, 50) and unembed.W_U.T.is_contiguous()
    torch.nn.init.normal_(unembed.W_U)
    x = torch.randn(3, 4, 16)
    torch.testing.assert_close(unembed(x), x @ unembed.W_U, atol=1e-5, rtol=1e-5)
    with torch.no_grad():
        unembed.b_U.normal_()
    torch.testing.assert_close(unembed(x), x @ unembed.W_U + unembed.b_U, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(
        unembed(x, logits_to_keep=1), (x @ unembed.W_U + unembed.b_U)[:, -1:], atol=1e-5, rtol=1e-5
    )
