"""Per-head qk LayerNorm (StableLM, Cohere) in half precision: HF's arithmetic bit for bit, hooks transparent."""

import pytest
import torch
import torch.nn.functional as F

from hooked import HookedTransformerConfig
from hooked.components.qk_norm import PerHeadLayerNorm
from hooked.core.hook_points import HookedRootModule

CFG = HookedTransformerConfig(d_model=64, d_head=16, n_heads=4, n_layers=1, n_ctx=8, act_fn="relu", eps=1e-5)


class Root(HookedRootModule):
    def __init__(self, norm):
        super().__init__()
        self.norm = norm
        self.setup()

    def forward(self, x):
        return self.norm(x)


def _root(dtype, **cfg):
    root = Root(PerHeadLayerNorm(CFG.replace(dtype=dtype, **cfg), 4))
    with torch.no_grad():
        root.norm.w.copy_(torch.rand(4, 16) + 0.5)
        root.norm.b.copy_(torch.rand(4, 16) - 0.5)
    torch.manual_seed(0)
    return root, (torch.randn(16, 32, 4, 16) * 3 + 1).to(dtype)  # [batch, pos, head, d_head]


def _per_head_fused(x, w, b):
    """HF's StableLmLayerNormPerHead: one nn.LayerNorm per head."""
    return torch.stack([F.layer_norm(x[..., h, :], (16,), w[h], b[h], CFG.eps) for h in range(4)], dim=-2)


def _cohere(x, w, b):
    """HF's CohereLayerNorm over d_head with `[head, d_head]` weights (plus a bias, zero in Cohere)."""
    h = x.float()
    mean = h.mean(-1, keepdim=True)
    h = (h - mean) * torch.rsqrt((h - mean).pow(2).mean(-1, keepdim=True) + CFG.eps)
    return (w.float() * h + b.float()).to(x.dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("gain_first", [False, True])
def test_per_head_layer_norm_is_hf_bit_for_bit_unless_a_hook_edits_it(dtype, gain_first):
    root, x = _root(dtype, norm_gain_in_fp32=gain_first)
    w, b = root.norm.w, root.norm.b
    expected = (_cohere if gain_first else _per_head_fused)(x, w, b)
    assert not torch.equal(expected, torch.addcmul(b, root.norm.normalize(x), w))  # the old two-rounding form
    out, cache = root.run_with_cache(x)
    identity = root.run_with_hooks(x, fwd_hooks=[("norm.hook_normalized", lambda t, hook: t)])
    for result in (root(x), out, identity):
        torch.testing.assert_close(result, expected, atol=0, rtol=0)

    def ablate(t, hook):
        t[..., 0] = 0.0

    ablated = root.run_with_hooks(x, fwd_hooks=[("norm.hook_normalized", ablate)])
    torch.testing.assert_close(ablated[..., 0], b[:, 0].expand(16, 32, 4), atol=0, rtol=0)


def test_float32_keeps_one_addcmul_over_all_heads():
    root, x = _root(torch.float32)
    expected = torch.addcmul(root.norm.b, root.norm.normalize(x), root.norm.w)
    torch.testing.assert_close(root(x), expected, atol=0, rtol=0)
