"""`components.moe`: grouped dispatch equals a per-token loop, hooks fire for idle experts, routing edits."""

from __future__ import annotations

import pytest
import torch

from hooked.components.moe import MoE, make_moe
from hooked.core.config import HookedTransformerConfig

CFG = dict(d_model=16, d_head=4, n_layers=1, n_ctx=8, d_mlp=8, act_fn="silu", gated_mlp=True, d_vocab=10)


def moe(**overrides) -> MoE:
    torch.manual_seed(0)
    layer = make_moe(HookedTransformerConfig(**dict(CFG, num_experts=4, experts_per_token=2, **overrides)))
    with torch.no_grad():
        for p in layer.parameters():
            p.normal_(0, 0.5)
    return layer


def naive(layer: MoE, x: torch.Tensor) -> torch.Tensor:
    """One token at a time: softmax, top-k, (renormalize), weighted sum of the chosen experts."""
    out = torch.zeros_like(x)
    for b in range(x.shape[0]):
        for p in range(x.shape[1]):
            probs = torch.softmax(layer.W_gate(x[b, p]).float(), -1)
            w, idx = probs.topk(layer.top_k)
            if layer.cfg.norm_topk_prob:
                w = w / w.sum()
            out[b, p] = sum(w[i] * layer.experts[int(e)](x[b, p]) for i, e in enumerate(idx))
    return out


@pytest.mark.parametrize("overrides", [dict(), dict(norm_topk_prob=True), dict(swiglu_limit=0.5, norm_topk_prob=True)])
def test_grouped_dispatch_equals_a_per_token_loop(overrides):
    layer, x = moe(**overrides), torch.randn(2, 5, 16)
    with torch.no_grad():
        torch.testing.assert_close(layer(x), naive(layer, x), atol=1e-5, rtol=0)


def test_every_expert_hook_fires_even_without_tokens():
    layer, seen = moe(), {}
    forced = torch.zeros(1, 3, 2, dtype=torch.long)
    forced[..., 1] = 1  # every token goes to experts 0 and 1; 2 and 3 get none
    layer.hook_expert_indices.add_hook(lambda i, hook: forced)
    for e, expert in enumerate(layer.experts):
        expert.hook_post.add_hook(lambda x, hook, e=e: seen.__setitem__(e, x.shape))
    with torch.no_grad():
        layer(torch.randn(1, 3, 16))
    assert seen == {0: (3, 8), 1: (3, 8), 2: (0, 8), 3: (0, 8)}


def test_shared_expert_is_added_with_its_sigmoid_gate():
    layer, x = moe(shared_expert_d_mlp=6), torch.randn(2, 3, 16)
    with torch.no_grad():
        routed = MoE.forward(layer, x)
        expected = routed + torch.sigmoid(layer.shared_expert_gate(x)) * layer.shared_expert(x)
        torch.testing.assert_close(layer(x), expected, atol=1e-6, rtol=0)


def test_transformer_lens_gpt_oss_moe_builds_the_clamped_variant():
    from hooked.compat.components import GptOssMoE

    layer = GptOssMoE(dict(CFG, num_experts=4, experts_per_token=2))
    assert layer.cfg.swiglu_limit == 7.0 and layer.cfg.norm_topk_prob and layer.W_gate.bias is not None
    assert layer(torch.randn(1, 3, 16)).shape == (1, 3, 16)


@pytest.mark.parametrize("mix_in_fp32", [False, True])
def test_half_precision_mixing_is_one_float32_or_dtype_product_then_one_sum(mix_in_fp32):
    """HF's default (`grouped_mm`) experts: weight each slot (Mixtral: in float32), sum a token's slots, cast once."""
    layer = moe(norm_topk_prob=True, moe_mix_in_fp32=mix_in_fp32).to(torch.bfloat16)
    x = torch.randn(2, 5, 16).to(torch.bfloat16)
    with torch.no_grad():
        indices, weights = layer.route(x)
        flat, expected = x.reshape(-1, 16), torch.zeros(10, 16, dtype=torch.float32 if mix_in_fp32 else torch.bfloat16)
        for t in range(10):
            slots = [layer.experts[int(e)](flat[t : t + 1])[0] for e in indices.reshape(10, 2)[t]]
            w = weights.reshape(10, 2)[t] if mix_in_fp32 else weights.reshape(10, 2)[t].to(torch.bfloat16)
            expected[t] = torch.stack([s.to(w.dtype) * wi for s, wi in zip(slots, w, strict=True)]).sum(
                0
            )  # w: 0-dim, so upcast s
        out = layer(x)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.reshape(10, 16), expected.to(torch.bfloat16), atol=0, rtol=0)
    other = moe(norm_topk_prob=True, moe_mix_in_fp32=not mix_in_fp32).to(torch.bfloat16)
    with torch.no_grad():
        assert not torch.equal(other(x), out)  # the two orders round differently: the flag matters


def test_gpt_oss_weights_are_a_softmax_over_the_top_k_logits_in_the_model_dtype():
    """HF's GptOssTopKRouter: `softmax(topk(logits).values, dtype=logits.dtype)`; an edit of the probs still rules."""
    layer = moe(swiglu_limit=0.5, norm_topk_prob=True).to(torch.bfloat16)
    x = torch.randn(2, 5, 16, dtype=torch.bfloat16)
    logits = layer.W_gate(x)
    values, want_indices = logits.topk(layer.top_k, dim=-1)
    indices, weights = layer.route(x)
    assert torch.equal(indices, want_indices)
    assert weights.dtype == torch.bfloat16 and torch.equal(weights, torch.softmax(values, -1, dtype=torch.bfloat16))

    def prefer_expert_3(probs, hook):
        probs[..., 3] = 10.0  # forces expert 3 into every token's top-k

    layer.hook_expert_weights.add_hook(prefer_expert_3)
    try:
        indices, weights = layer.route(x)
    finally:
        layer.hook_expert_weights.remove_hooks()
    assert (indices == 3).any(-1).all()
    probs = torch.softmax(logits.float(), -1)
    probs[..., 3] = 10.0
    chosen = probs.gather(-1, indices)
    torch.testing.assert_close(weights, chosen / chosen.sum(-1, keepdim=True), atol=0, rtol=0)
