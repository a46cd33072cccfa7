"""MLP's `linear`: HF's fused `addmm`, or (Falcon's `FalconLinear`) the product then the bias."""

import torch

from hooked import HookedTransformerConfig
from hooked.components.mlp import MLP, linear


def test_bias_after_the_matmul_is_two_ops():
    torch.manual_seed(0)
    x, W, b = (torch.randn(*shape).to(torch.bfloat16) for shape in ((8, 16, 32), (32, 48), (48,)))
    two_ops = torch.matmul(x, W) + b
    torch.testing.assert_close(linear(x, W, b, bias_after=True), two_ops, atol=0, rtol=0)
    torch.testing.assert_close(linear(x, W, b), torch.nn.functional.linear(x, W.t(), b), atol=0, rtol=0)
    assert not torch.equal(linear(x, W, b), two_ops)


def test_mlp_reads_bias_after_matmul_from_the_config():
    cfg = HookedTransformerConfig(
        d_model=32, d_head=8, n_layers=1, n_ctx=8, d_mlp=48, act_fn="gelu", dtype=torch.bfloat16, bias_after_matmul=True
    )
    mlp = MLP(cfg)
    torch.manual_seed(0)
    with torch.no_grad():
        for p in mlp.parameters():
            p.copy_(torch.randn(p.shape))
    x = torch.randn(8, 16, 32).to(torch.bfloat16)
    post = mlp.act_fn(torch.matmul(x, mlp.W_in) + mlp.b_in)
    torch.testing.assert_close(mlp(x), torch.matmul(post, mlp.W_out) + mlp.b_out, atol=0, rtol=0)
