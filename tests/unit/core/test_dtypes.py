"""`hooked.core.dtypes`: a parameter is cast with `.to(dtype)` unless its module has its own rule (Gemma's gains)."""

import pytest
import torch

from hooked import HookedTransformerConfig
from hooked.components.norms import RMSNorm, make_norm
from hooked.core.dtypes import cast_parameter, parameter_dtype


def _cfg(**kw):
    return HookedTransformerConfig(
        d_model=8, d_head=4, n_layers=1, n_ctx=8, d_vocab=10, act_fn="gelu", normalization_type="RMS", **kw
    )


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gemma_gains_are_float32_with_w_rounded_in_half_precision(dtype):
    norm = make_norm(_cfg(norm_gain_in_fp32=True, norm_gain_offset=1.0, dtype=dtype))
    assert parameter_dtype(norm, "w", dtype) == torch.float32 == norm.w.dtype
    gain = 1.0 + torch.tensor([1e-3, -2.5e-4, 0.3, 1e-9])  # 1 + w, float32
    cast = cast_parameter(norm, "w", gain, dtype)
    assert cast.dtype == torch.float32
    assert torch.equal(cast, 1.0 + (gain - 1.0).to(dtype).float())
    assert parameter_dtype(norm, "b", dtype) == dtype  # only the gain


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_full_precision_models_store_every_parameter_in_their_dtype(dtype):
    norm = make_norm(_cfg(norm_gain_in_fp32=True, norm_gain_offset=1.0, dtype=dtype))
    assert parameter_dtype(norm, "w", dtype) == dtype == norm.w.dtype
    gain = torch.rand(8) + 0.5
    assert torch.equal(cast_parameter(norm, "w", gain, dtype), gain.to(dtype))


def test_modules_without_a_rule_cast_with_to():
    norm = RMSNorm(_cfg(dtype=torch.bfloat16))
    assert parameter_dtype(norm, "w", torch.bfloat16) == torch.bfloat16 == norm.w.dtype
    gain = torch.rand(8)
    assert torch.equal(cast_parameter(norm, "w", gain, torch.float16), gain.half())
