"""Normalization layers: LayerNorm and RMSNorm, each with a parameter-free `Pre` form.

Every norm exposes `hook_scale` (the divisor, `[..., 1]`) and `hook_normalized` (the
input divided by it, **before** the gain). The statistics are computed in float32.
Folding a norm's gain into the matrices that read it (`fold_ln`) turns `LayerNorm`
into `LayerNormPre` and `RMSNorm` into `RMSNormPre` without changing any hook value.
"""

from __future__ import annotations

import torch
import torch.nn as nn
from jaxtyping import Float

from hooked.config import HookedTransformerConfig
from hooked.hook_points import HookPoint


def _normalize(hook_scale: HookPoint, x: torch.Tensor, var: torch.Tensor, eps: float) -> torch.Tensor:
    """`x / sqrt(var + eps)`, with the divisor passing through `hook_scale`.

    Computed as `x * rsqrt(var + eps)`, bit for bit what HuggingFace computes, unless a
    hook replaced or edited the scale, in which case the edited scale divides `x`.
    """
    scale = (var + eps).sqrt()
    if torch.is_inference(scale):  # inference tensors have no version counter: compare values instead
        before = scale.clone() if hook_scale._fwd_fns else scale
        hooked = hook_scale(scale)
        unchanged = hooked is scale and (before is scale or torch.equal(before, scale))
    else:
        version = scale._version
        hooked = hook_scale(scale)
        unchanged = hooked is scale and scale._version == version
    if unchanged:
        return x * torch.rsqrt(var + eps)
    return x / hooked


class LayerNormPre(nn.Module):
    """Center and divide by the standard deviation over the last axis; no parameters."""

    def __init__(self, cfg: HookedTransformerConfig, length: int | None = None):
        super().__init__()
        self.eps = cfg.eps
        self.length = length or cfg.d_model
        self.hook_scale = HookPoint()  # [batch, pos, 1] (or [batch, pos, head, 1])
        self.hook_normalized = HookPoint()  # [batch, pos, length]

    def normalize(self, x: Float[torch.Tensor, "... length"]) -> Float[torch.Tensor, "... length"]:
        x32 = x.float()
        var, mean = torch.var_mean(x32, dim=-1, correction=0, keepdim=True)
        return self.hook_normalized(_normalize(self.hook_scale, x32 - mean, var, self.eps).to(x.dtype))

    def forward(self, x: Float[torch.Tensor, "... length"]) -> Float[torch.Tensor, "... length"]:
        return self.normalize(x)


class LayerNorm(LayerNormPre):
    """LayerNorm: `normalized * w + b`."""

    def __init__(self, cfg: HookedTransformerConfig, length: int | None = None):
        super().__init__(cfg, length)
        self.w = nn.Parameter(torch.ones(self.length, dtype=cfg.dtype))
        self.b = nn.Parameter(torch.zeros(self.length, dtype=cfg.dtype))

    def forward(self, x: Float[torch.Tensor, "... length"]) -> Float[torch.Tensor, "... length"]:
        return torch.addcmul(self.b, self.normalize(x), self.w)


class RMSNormPre(nn.Module):
    """Divide by the root mean square over the last axis; no parameters."""

    def __init__(self, cfg: HookedTransformerConfig, length: int | None = None):
        super().__init__()
        self.eps = cfg.eps
        self.length = length or cfg.d_model
        self.hook_scale = HookPoint()  # [batch, pos, 1] (or [batch, pos, head, 1])
        self.hook_normalized = HookPoint()  # [batch, pos, length]

    def normalize(self, x: Float[torch.Tensor, "... length"]) -> Float[torch.Tensor, "... length"]:
        x32 = x.float()
        var = x32.pow(2).mean(-1, keepdim=True)
        return self.hook_normalized(_normalize(self.hook_scale, x32, var, self.eps).to(x.dtype))

    def forward(self, x: Float[torch.Tensor, "... length"]) -> Float[torch.Tensor, "... length"]:
        return self.normalize(x)


class RMSNorm(RMSNormPre):
    """RMSNorm: `normalized * w` (Gemma's `1 + w` is stored already added)."""

    def __init__(self, cfg: HookedTransformerConfig, length: int | None = None):
        super().__init__(cfg, length)
        self.w = nn.Parameter(torch.ones(self.length, dtype=cfg.dtype))

    def forward(self, x: Float[torch.Tensor, "... length"]) -> Float[torch.Tensor, "... length"]:
        return self.normalize(x) * self.w


NORMS = {"LN": LayerNorm, "LNPre": LayerNormPre, "RMS": RMSNorm, "RMSPre": RMSNormPre}


def make_norm(cfg: HookedTransformerConfig, kind: str | None = None, length: int | None = None) -> nn.Module:
    """The norm module for `kind` (default `cfg.normalization_type`); identity for None."""
    kind = cfg.normalization_type if kind is None else kind
    if kind is None:
        return nn.Identity()
    return NORMS[kind](cfg, length)
