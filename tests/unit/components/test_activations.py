"""Activations: HF's GELU formulas bit for bit in half precision, the fused kernel (as close) in float32."""

import pytest
import torch
import torch.nn.functional as F

from hooked.components.activations import get_activation


def _hf(name: str):
    from transformers.activations import ACT2FN
    from transformers.models.bloom.modeling_bloom import bloom_gelu_forward

    return bloom_gelu_forward if name == "gelu_bloom" else ACT2FN[name]


NAMES = ["gelu", "gelu_new", "gelu_fast", "gelu_bloom", "gelu_pytorch_tanh", "relu", "silu"]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_activations_equal_hf_bit_for_bit_in_half_precision(name, dtype):
    x = (torch.randn(4096, generator=torch.Generator().manual_seed(0)) * 4).to(dtype)
    ours = get_activation(name)(x)
    assert ours.dtype == dtype
    torch.testing.assert_close(ours, _hf(name)(x), atol=0, rtol=0)


@pytest.mark.parametrize("name", ["gelu_new", "gelu_fast", "gelu_bloom"])
def test_tanh_gelus_use_the_fused_kernel_in_float32(name):
    x = torch.randn(4096, generator=torch.Generator().manual_seed(1)) * 4
    ours = get_activation(name)(x)
    torch.testing.assert_close(ours, F.gelu(x, approximate="tanh"), atol=0, rtol=0)
    torch.testing.assert_close(ours, _hf(name)(x), atol=1e-6, rtol=1e-6)  # HF's formula agrees to fp32 rounding
