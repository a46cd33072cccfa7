"""Activation functions by their config name (`cfg.act_fn`)."""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F


def solu(x: torch.Tensor) -> torch.Tensor:
    """Softmax linear unit: x * softmax(x) over the neuron axis."""
    return x * F.softmax(x, dim=-1)


def _gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    # gelu_new, gelu_fast and gelu_pytorch_tanh are the same tanh approximation.
    return F.gelu(x, approximate="tanh")


ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu_new": _gelu_tanh,
    "gelu_fast": _gelu_tanh,
    "gelu_pytorch_tanh": _gelu_tanh,
    "silu": F.silu,
    "solu": solu,
    "solu_ln": solu,
}


def get_activation(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    if name not in ACTIVATIONS:
        raise ValueError(f"Unknown activation {name!r}; supported: {', '.join(ACTIVATIONS)}")
    return ACTIVATIONS[name]
