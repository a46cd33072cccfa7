"""The dtype each parameter is stored in: the model's, except gains a module keeps in float32.

A module lists such parameters in `float32_parameters` (e.g. `RMSNormGainFirst.w`: HF's
Gemma multiplies by `1 + w` computed in float32, which rounds differently once stored in
bfloat16). Loading, weight placement and `.to(dtype)` consult this one rule.
"""

from __future__ import annotations

import torch
import torch.nn as nn

HALF_DTYPES = (torch.bfloat16, torch.float16)


def parameter_dtype(module: nn.Module, leaf: str, dtype: torch.dtype) -> torch.dtype:
    """`dtype`, or float32 for a parameter that `module` keeps in float32 when the model runs in half precision."""
    if dtype in HALF_DTYPES and leaf in getattr(module, "float32_parameters", ()):
        return torch.float32
    return dtype
