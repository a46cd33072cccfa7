"""How a tensor becomes a parameter of a model running in some dtype: `.to(dtype)`, unless its module says otherwise.

A module may define `cast_parameter(leaf, tensor, dtype)`. Gemma's norms do
(`RMSNormGainFirst` with `cfg.norm_gain_offset`): `ln*.w` holds HF's `1 + w`, which a
half-precision HF model computes in float32 from `w` rounded to its dtype, so the gain is
stored in float32, as that value. Loading, weight placement and `.to` all go through here.
"""

from __future__ import annotations

import torch
import torch.nn as nn

HALF_DTYPES = (torch.bfloat16, torch.float16)


def parameter_requires_grad(module: torch.nn.Module, leaf: str) -> bool:
    """`requires_grad` of the parameter `leaf` of `module`, which a loader is about to replace."""
    param = module._parameters[leaf]
    if param is None:
        raise ValueError(f"{type(module).__name__}.{leaf} is registered as None: there is no parameter to load into")
    return param.requires_grad


def cast_parameter(
    module: nn.Module, leaf: str, tensor: torch.Tensor, dtype: torch.dtype, device: torch.device | str | None = None
) -> torch.Tensor:
    """`tensor` as `module.<leaf>` stores it in a `dtype` model (on `device`)."""
    rule = getattr(module, "cast_parameter", None)
    if rule is None:
        return tensor.to(device=device, dtype=dtype)
    return rule(leaf, tensor.to(device=device), dtype)


def parameter_dtype(module: nn.Module, leaf: str, dtype: torch.dtype) -> torch.dtype:
    """The dtype `module.<leaf>` is stored in when the model runs in `dtype` (float32 for Gemma's gains
    in half precision)."""
    return cast_parameter(module, leaf, torch.empty(0, dtype=dtype, device="meta"), dtype).dtype
