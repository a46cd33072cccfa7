"""Activation functions by their config name (`cfg.act_fn`)."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F


def solu(x: torch.Tensor) -> torch.Tensor:
    """Softmax linear unit: x * softmax(x) over the neuron axis."""
    return x * F.softmax(x, dim=-1)


def _gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


def _half(formula: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[torch.Tensor], torch.Tensor]:
    """The tanh GELU: fused in float32; in half precision HF's `formula` op by op, each op rounding as HF's does.

    The formulas agree to float32 rounding (fused: ~5x faster on CPU), but in bfloat16 every
    intermediate rounds, so only HF's exact sequence of ops gives HF's bits.
    """

    def gelu(x: torch.Tensor) -> torch.Tensor:
        return formula(x) if x.dtype in (torch.float16, torch.bfloat16) else F.gelu(x, approximate="tanh")

    gelu.__name__ = formula.__name__
    return gelu


@_half
def gelu_new(x: torch.Tensor) -> torch.Tensor:
    """HF's `NewGELUActivation` (GPT-2, Phi)."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


@_half
def gelu_fast(x: torch.Tensor) -> torch.Tensor:
    """HF's `FastGELUActivation`."""
    return 0.5 * x * (1.0 + torch.tanh(x * 0.7978845608 * (1.0 + 0.044715 * x * x)))


@_half
def gelu_bloom(x: torch.Tensor) -> torch.Tensor:
    """HF's `bloom_gelu_forward` (BLOOM): the same approximation, its ops in another order."""
    return x * 0.5 * (1.0 + torch.tanh(0.79788456 * x * (1 + 0.044715 * x * x)))


def relu2(x: torch.Tensor) -> torch.Tensor:
    """Squared ReLU (HF's `ReLUSquaredActivation`, Nemotron-H's MLPs)."""
    return torch.square(F.relu(x))


def quick_gelu(x: torch.Tensor) -> torch.Tensor:
    """OpenAI CLIP's sigmoid approximation of GELU, `x * sigmoid(1.702 x)` (HF's `QuickGELUActivation`)."""
    return x * torch.sigmoid(1.702 * x)


ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "relu": F.relu,
    "relu2": relu2,
    "gelu": F.gelu,
    "gelu_new": gelu_new,
    "gelu_fast": gelu_fast,
    "gelu_bloom": gelu_bloom,
    "gelu_pytorch_tanh": _gelu_tanh,
    "silu": F.silu,
    "solu": solu,
    "solu_ln": solu,
    "quick_gelu": quick_gelu,
}


def get_activation(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    if name not in ACTIVATIONS:
        raise ValueError(f"Unknown activation {name!r}; supported: {', '.join(ACTIVATIONS)}")
    return ACTIVATIONS[name]
