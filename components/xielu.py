"""xIELU (arXiv 2411.13010), Apertus's trainable activation, in HuggingFace's parameterisation.

    alpha_p = softplus(alpha_p_raw)            alpha_n = beta + softplus(alpha_n_raw)
    x > 0:   alpha_p * x^2 + beta * x
    x <= 0:  alpha_n * (expm1(min(x, eps)) - x) + beta * x

`alpha_p` and `alpha_n` are stored raw (softplus-inverse space) as HF stores them, so an
Apertus checkpoint's `mlp.act_fn.*` load unchanged; `beta` and `eps` are buffers.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from jaxtyping import Float


def _softplus_inverse(value: float, dtype: torch.dtype) -> torch.Tensor:
    return torch.log(torch.expm1(torch.tensor(value, dtype=torch.float64))).to(dtype)


class XIELU(nn.Module):
    """Trainable xIELU: one `alpha_p`, `alpha_n` per layer (HF's defaults 0.8, 0.8, beta 0.5)."""

    beta: torch.Tensor  # buffers
    eps: torch.Tensor

    def __init__(
        self,
        alpha_p_init: float = 0.8,
        alpha_n_init: float = 0.8,
        beta_init: float = 0.5,
        eps: float = -1e-6,
        dtype: torch.dtype = torch.float32,
    ):
        super().__init__()
        self.alpha_p = nn.Parameter(_softplus_inverse(alpha_p_init, dtype))  # []
        self.alpha_n = nn.Parameter(_softplus_inverse(alpha_n_init - beta_init, dtype))  # []
        self.register_buffer("beta", torch.tensor(beta_init, dtype=dtype))
        self.register_buffer("eps", torch.tensor(eps, dtype=dtype))

    def forward(self, x: Float[torch.Tensor, "... d_mlp"]) -> Float[torch.Tensor, "... d_mlp"]:
        alpha_p = F.softplus(self.alpha_p)
        alpha_n = self.beta + F.softplus(self.alpha_n)
        return xielu(x, alpha_p, alpha_n, self.beta, self.eps)


def xielu(x: torch.Tensor, alpha_p, alpha_n, beta, eps) -> torch.Tensor:
    """xIELU with given (positive-space) parameters, as HF's `_xielu_python`."""
    negative = (torch.expm1(torch.minimum(x, torch.as_tensor(eps, dtype=x.dtype))) - x) * alpha_n + beta * x
    return torch.where(x > 0, alpha_p * x * x + beta * x, negative)
