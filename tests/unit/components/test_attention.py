"""Attention's per-family half-precision numerics (converter-set options), each against HF's formula."""

import math

import pytest
import torch

from hooked import HookedTransformerConfig
from hooked.components.attention import Attention
from hooked.components.rotary import apply_rotary, rotary_cos_sin
from hooked.core.hook_points import HookedRootModule

BASE = dict(d_model=32, d_head=8, n_heads=4, n_layers=1, n_ctx=16, act_fn="relu", attn_implementation="eager")


class Root(HookedRootModule):
    def __init__(self, attn):
        super().__init__()
        self.attn = attn
        self.setup()

    def forward(self, x):
        return self.attn(x, x, x)


def _run(dtype=torch.bfloat16, **options):
    cfg = HookedTransformerConfig(**BASE, dtype=dtype, **options)
    root = Root(Attention(cfg))
    torch.manual_seed(0)
    with torch.no_grad():
        for p in root.parameters():
            p.copy_(torch.randn(p.shape) * 0.5)
    x = torch.randn(8, 16, 32).to(dtype)
    out, cache = root.run_with_cache(x)
    return out, cache, root.attn, x


def _causal(scores):
    n = scores.shape[-1]
    return scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))


def _q_k(cache, rotated=False):
    name = "rot_" if rotated else ""
    return cache[f"attn.hook_{name}q"].transpose(1, 2), cache[f"attn.hook_{name}k"].transpose(1, 2)


def test_gptj_neo_scores_come_from_float32_q_and_k():
    out, cache, _, _ = _run(attn_scores_in_fp32=True)
    q, k = _q_k(cache)
    expected = _causal(torch.matmul(q.float(), k.float().transpose(-1, -2)) * (1 / math.sqrt(8)))
    assert cache["attn.hook_attn_scores"].dtype == torch.float32
    assert cache["attn.hook_pattern"].dtype == torch.bfloat16 and out.dtype == torch.bfloat16
    torch.testing.assert_close(cache["attn.hook_attn_scores"], expected, atol=0, rtol=0)
    _, plain, _, _ = _run()  # default: the product in the model dtype, as LLaMA's eager attention
    assert plain["attn.hook_attn_scores"].dtype == torch.bfloat16
    assert not torch.equal(plain["attn.hook_attn_scores"].float(), expected)


def test_falcon_divides_the_scores_by_sqrt_d_head():
    _, cache, _, _ = _run(torch.float16, attn_scale_divides=True)  # float16: the two differ in a few scores
    q, k = _q_k(cache)
    product = torch.matmul(q, k.transpose(-1, -2))
    divided, multiplied = _causal(product / math.sqrt(8)), _causal(product * (1 / math.sqrt(8)))
    assert not torch.equal(divided, multiplied)
    torch.testing.assert_close(cache["attn.hook_attn_scores"], divided, atol=0, rtol=0)
    _, plain, _, _ = _run(torch.float16)
    torch.testing.assert_close(plain["attn.hook_attn_scores"], multiplied, atol=0, rtol=0)


@pytest.mark.parametrize("tables_fp32", [False, True])  # OLMo-1 keeps the tables in float32, Cohere rounds them
def test_rotary_in_float32_then_cast_back(tables_fp32):
    rotary = dict(positional_embedding_type="rotary", rotary_dim=8)
    _, cache, _, _ = _run(rotary_in_fp32=True, rotary_tables_in_fp32=tables_fp32, **rotary)
    _, plain, _, _ = _run(**rotary)
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, 8, 2).float() / 8))
    positions = torch.arange(16)[None]
    cos, sin = rotary_cos_sin(positions, inv_freq, False, torch.float32 if tables_fp32 else torch.bfloat16)
    q = cache["attn.hook_q"]
    expected = apply_rotary(q.float(), cos.float(), sin.float()).to(torch.bfloat16)
    torch.testing.assert_close(cache["attn.hook_rot_q"], expected, atol=0, rtol=0)
    assert cache["attn.hook_rot_q"].dtype == torch.bfloat16
    assert not torch.equal(plain["attn.hook_rot_q"], expected)


def test_falcon_bias_after_the_matmul():
    out, cache, attn, x = _run(bias_after_matmul=True)
    W_Q = attn.W_Q.transpose(0, 1).reshape(32, 32)  # [d_model, head * d_head]
    q = (torch.matmul(x, W_Q) + attn.b_Q.reshape(-1)).view(8, 16, 4, 8)  # FalconLinear: product, then bias
    torch.testing.assert_close(cache["attn.hook_q"], q, atol=0, rtol=0)
    z = cache["attn.hook_z"].reshape(-1, 32)  # [batch * pos, head * d_head]
    expected = (torch.mm(z, attn.W_O.reshape(32, 32)) + attn.b_O).view(8, 16, 32)
    torch.testing.assert_close(out, expected, atol=0, rtol=0)
    fused = torch.addmm(attn.b_O, z, attn.W_O.reshape(32, 32)).view(8, 16, 32)  # HF's nn.Linear (the default)
    assert not torch.equal(expected, fused)
