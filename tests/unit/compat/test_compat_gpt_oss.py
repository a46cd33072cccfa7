"""TransformerLens's GPT-OSS MLP names (`components.mlps.gpt_oss_moe`, MLPFactory) build hooked's MoE."""

from __future__ import annotations

import torch

from hooked.compat.components import GPT_OSS_ALPHA, GPT_OSS_LIMIT, GptOssExpert, GptOssMoE
from hooked.compat.factories import MLPFactory
from hooked.core.config import HookedTransformerConfig


def cfg(**kw) -> HookedTransformerConfig:
    return HookedTransformerConfig(
        n_layers=1,
        d_model=16,
        d_head=4,
        n_heads=4,
        d_mlp=8,
        n_ctx=8,
        d_vocab=10,
        act_fn="silu",
        gated_mlp=True,
        num_experts=4,
        experts_per_token=2,
        original_architecture="GptOssForCausalLM",
        **kw,
    )


def test_expert_is_the_clamped_swiglu():
    expert = GptOssExpert(cfg())
    x = torch.randn(3, 16) * 4
    gate = expert.W_gate(x).clamp(max=GPT_OSS_LIMIT)
    up = expert.W_in(x).clamp(-GPT_OSS_LIMIT, GPT_OSS_LIMIT)
    expected = expert.W_out((up + 1) * gate * torch.sigmoid(GPT_OSS_ALPHA * gate))
    torch.testing.assert_close(expert(x), expected, rtol=0, atol=1e-6)


def test_factory_builds_gpt_oss_moe_only_for_gpt_oss():
    assert isinstance(MLPFactory.create_mlp(cfg()), GptOssMoE)
    mixtral = MLPFactory.create_mlp(cfg().replace(original_architecture="MixtralForCausalLM"))
    assert not isinstance(mixtral, GptOssMoE) and mixtral.W_gate.bias is None
