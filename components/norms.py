"""Normalization layers: LayerNorm and RMSNorm, each with a parameter-free `Pre` form.

Every norm exposes `hook_scale` (the divisor, `[..., 1]`) and `hook_normalized` (the
input divided by it, **before** the gain). The statistics are computed in float32.
Folding a norm's gain into the matrices that read it (`fold_ln`) turns `LayerNorm`
into `LayerNormPre` and `RMSNorm` into `RMSNormPre` without changing any hook value.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F
from jaxtyping import Float

from hooked.core.config import HookedTransformerConfig
from hooked.core.dtypes import HALF_DTYPES
from hooked.core.hook_points import HookPoint


def unedited(original: torch.Tensor, before: torch.Tensor, hooked: torch.Tensor) -> bool:
    """Whether hooks left `original` as it was: equal values (`before` is a copy taken before the
    hooks ran) and, while autograd records, the same gradient path.

    A value-equal tensor that cuts the gradient path is an edit: `scale.detach()` (a stop-gradient,
    as circuit-tracer's frozen norms) or a cached copy must be used as returned. A copy that keeps
    the path (`x.clone()`, `x + 0`) is no edit, so the fused kernels stay bit for bit.
    """
    if hooked is not original and _cuts_gradient(original, hooked):
        return False
    return torch.equal(before, hooked)


def _cuts_gradient(original: torch.Tensor, hooked: torch.Tensor) -> bool:
    """Whether `hooked` stops the gradient that would reach `original`: detached, or a new leaf."""
    if original.requires_grad and not hooked.requires_grad:
        return True
    return hooked.requires_grad and hooked.grad_fn is None


def _normalize(
    hook_scale: HookPoint, x: torch.Tensor, var: torch.Tensor, eps: float, untouched: Callable | None = None
) -> torch.Tensor:
    return _normalize_edit(hook_scale, x, var, eps, untouched)[0]


def _normalize_edit(
    hook_scale: HookPoint, x: torch.Tensor, var: torch.Tensor, eps: float, untouched: Callable | None = None
) -> tuple[torch.Tensor, bool]:
    """`x / sqrt(var + eps)`, with the divisor passing through `hook_scale`.

    Computed as `x * rsqrt(var + eps)` (or `untouched()`, a fused kernel giving that value),
    bit for bit what HuggingFace computes, unless a hook replaced or edited the scale (then
    the edited scale divides `x`) or a backward hook on the scale needs the gradient to flow
    through it.
    """
    untouched = untouched or (lambda: x * torch.rsqrt(var + eps))
    if not hook_scale.observed:  # nothing can read or edit the scale: skip computing it
        return untouched(), False
    scale = (var + eps).sqrt()
    if hook_scale.needs_grad_path:
        return x / hook_scale(scale), True
    if hook_scale.is_read_only:  # caching hooks only: the scale cannot change
        hook_scale(scale)
        return untouched(), False
    before = scale.clone()  # [batch, pos, 1]: cheap to compare, catches in-place edits
    hooked = hook_scale(scale)
    if torch.compiler.is_compiling():  # both computed, one selected on the device: no host sync, no graph break
        return torch.where((before == hooked).all(), untouched(), x / hooked), True
    if unedited(scale, before, hooked):  # unchanged (the tensor itself or an equal copy): HF's kernel, bit for bit
        return untouched(), False
    return x / hooked, True


def through_hook_normalized(hook: HookPoint, n32: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The float32 normalized input of a gain-first norm, after `hook_normalized` (which sees it cast to `dtype`).

    Unless a hook edits the value (a value-equal copy is no edit), the float32 value goes on, so
    hooking never changes the result; an edited value goes on as the hook left it.
    """
    if not hook.observed:
        return n32
    cast = n32.to(dtype)  # [..., length]
    if hook.is_read_only:  # caching hooks only: the value cannot change
        hook(cast)
        return n32
    before = cast.clone()
    hooked = hook(cast)
    if torch.compiler.is_compiling():  # selected on the device: no host sync, no graph break
        return torch.where((before == hooked).all(), n32, hooked.float())
    return n32 if unedited(cast, before, hooked) else hooked.float()


class _NormPre(nn.Module):
    """Shared machinery: hook points, float32 statistics, the division through `hook_scale`."""

    def __init__(self, cfg: HookedTransformerConfig, length: int | None = None):
        super().__init__()
        self.eps = cfg.eps
        self.length = length or cfg.d_model
        self.hook_scale = HookPoint()  # [batch, pos, 1] (or [batch, pos, head, 1])
        self.hook_normalized = HookPoint()  # [batch, pos, length]

    def statistics(self, x32: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`(numerator, var)`: what is divided, and the mean square whose root divides it."""
        raise NotImplementedError

    def normalize(self, x: Float[torch.Tensor, "... length"]) -> Float[torch.Tensor, "... length"]:
        x32 = x.float()
        if not self.hook_scale.observed:  # nothing can read or edit the scale: skip computing it
            return self.hook_normalized(self.fused(x32).to(x.dtype))
        numerator, var = self.statistics(x32)
        normalized = _normalize(self.hook_scale, numerator, var, self.eps, lambda: self.fused(x32))
        return self.hook_normalized(normalized.to(x.dtype))

    def normalize_edit(self, x: Float[torch.Tensor, "... length"]) -> tuple[torch.Tensor, bool]:
        """`(normalize(x), edited)`: whether a hook on the scale or the normalized input changed it."""
        x32 = x.float()
        if self.hook_scale.observed:
            numerator, var = self.statistics(x32)
            n32, edited = _normalize_edit(self.hook_scale, numerator, var, self.eps, lambda: self.fused(x32))
        else:
            n32, edited = self.fused(x32), False
        cast = n32.to(x.dtype)  # [..., length]
        if not self.hook_normalized.observed:
            return cast, edited
        if self.hook_normalized.is_read_only:  # caching hooks only: the value cannot change
            self.hook_normalized(cast)
            return cast, edited
        before = cast.clone()
        hooked = self.hook_normalized(cast)
        if torch.compiler.is_compiling():  # no host sync: a possible edit, settled on the device by the caller
            return hooked, True
        return hooked, edited or not unedited(cast, before, hooked)

    def fused(self, x32: torch.Tensor) -> torch.Tensor:
        """The normalized value when no hook changes the scale, computed in as few kernels as possible."""
        numerator, var = self.statistics(x32)
        return numerator * torch.rsqrt(var + self.eps)

    def forward(self, x: Float[torch.Tensor, "... length"]) -> Float[torch.Tensor, "... length"]:
        return self.normalize(x)


class LayerNormPre(_NormPre):
    """Center and divide by the standard deviation over the last axis; no parameters."""

    def statistics(self, x32: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        var, mean = torch.var_mean(x32, dim=-1, correction=0, keepdim=True)
        return x32 - mean, var

    def fused(self, x32: torch.Tensor) -> torch.Tensor:
        # One kernel, as HF's nn.LayerNorm: on CPU, var_mean plus the separate arithmetic takes
        # ~20x longer (measured 4.9 vs 0.2 ms on [4, 128, 768], one thread).
        return F.layer_norm(x32, (x32.shape[-1],), eps=self.eps)


class LayerNorm(LayerNormPre):
    """LayerNorm: `normalized * w + b`.

    Unless a hook edits `hook_scale` or `hook_normalized` (or needs their gradient), the output
    is HF's fused `layer_norm` with the gain and bias inside, rounded once to the input's dtype:
    bit for bit HF's in bfloat16/float16 too. An edited value takes effect: `edited * w + b`.
    """

    def __init__(self, cfg: HookedTransformerConfig, length: int | None = None):
        super().__init__(cfg, length)
        self.w = nn.Parameter(torch.ones(self.length, dtype=cfg.dtype))
        self.b = nn.Parameter(torch.zeros(self.length, dtype=cfg.dtype))

    def forward(self, x: Float[torch.Tensor, "... length"]) -> Float[torch.Tensor, "... length"]:
        if x.dtype != self.w.dtype or self.hook_scale.needs_grad_path or self.hook_normalized.needs_grad_path:
            return torch.addcmul(self.b, self.normalize(x), self.w)  # gradients flow through the hooks
        if not (self.hook_scale.observed or self.hook_normalized.observed):
            return self.affine(x)
        normalized, edited = self.normalize_edit(x)  # the hooks see (and may edit) the normalized input
        if not edited:  # the plain forward's value (and gradient path)
            return self.affine(x)
        if torch.compiler.is_compiling():  # `edited` means "maybe" when compiled: select on the device
            plain = self.fused(x.float()).to(x.dtype)  # the unedited normalized input
            return torch.where((plain == normalized).all(), self.affine(x), torch.addcmul(self.b, normalized, self.w))
        return torch.addcmul(self.b, normalized, self.w)

    def affine(self, x: Float[torch.Tensor, "... length"]) -> Float[torch.Tensor, "... length"]:
        """`normalized * w + b` in one kernel, as HF's `nn.LayerNorm`: in half precision it rounds once, not 3 times."""
        return F.layer_norm(x, (x.shape[-1],), self.w, self.b, self.eps)


def centred_statistics(x32: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`(x - mean, mean((x - mean)^2))` as two plain means, the order of HF's hand-written LayerNorms (Cohere)."""
    centred = x32 - x32.mean(-1, keepdim=True)
    return centred, centred.pow(2).mean(-1, keepdim=True)


def gain_first_layer_norm(norm: _NormPre, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """`(n32 * w + b).to(dtype)`: the float32 normalized input times the gain (plus bias), cast once.

    `hook_normalized` sees the cast normalized input; unless a hook edits it, the float32 value is used.
    """
    n32 = _normalize(norm.hook_scale, *centred_statistics(x.float()), norm.eps)
    n32 = through_hook_normalized(norm.hook_normalized, n32, x.dtype)
    return (w.float() * n32 + b.float()).to(x.dtype)


class LayerNormGainFirst(LayerNorm):
    """LayerNorm as HF's Cohere computes it below float32: `(w * n32 + b).to(dtype)`.

    The mean and variance are two plain means (`centred_statistics`) and the gain multiplies
    the float32 normalized input before the cast, so bfloat16/float16 match HF bit for bit.
    In float32 (where the two orders agree to rounding) it is the fused `LayerNorm`.
    """

    def forward(self, x: Float[torch.Tensor, "... length"]) -> Float[torch.Tensor, "... length"]:
        if x.dtype == torch.float32:
            return super().forward(x)
        return gain_first_layer_norm(self, x, self.w, self.b)


class RMSNormPre(_NormPre):
    """Divide by the root mean square over the last axis; no parameters."""

    def statistics(self, x32: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x32, x32.pow(2).mean(-1, keepdim=True)


class RMSNorm(RMSNormPre):
    """RMSNorm: `normalized * w` (Gemma's `1 + w` is stored already added)."""

    def __init__(self, cfg: HookedTransformerConfig, length: int | None = None):
        super().__init__(cfg, length)
        self.w = nn.Parameter(torch.ones(self.length, dtype=cfg.dtype))

    def forward(self, x: Float[torch.Tensor, "... length"]) -> Float[torch.Tensor, "... length"]:
        return self.normalize(x) * self.w


class RMSNormGainFirst(RMSNorm):
    """RMSNorm whose gain multiplies the float32 normalized input before the cast: `(n32 * w).to(dtype)`.

    HF's Gemma (whose `w` is stored here with its `+ 1` added, TransformerLens's
    convention) and OLMo-2 compute this; LLaMA casts first, `n.to(dtype) * w`. The two
    differ only below float32. `hook_normalized` sees the cast normalized input; when no
    hook edits it, the float32 value is used, so hooking never changes the result.

    With `cfg.norm_gain_offset` (Gemma's 1), `w` is HF's `offset + w_hf`: a half-precision HF
    model rounds `w_hf` to its dtype and adds the offset in float32, so `cast_parameter` does
    the same and `w` stays float32 in a bfloat16/float16 model, also through `.to(dtype)`
    (rounded to bfloat16, `1 + w_hf` would be another gain). With `cfg.norm_gain_fp32_in_float16`
    (GPT-OSS, whose HF model keeps its norm weights float32 in a float16 model) `w` is float32 there.
    """

    def __init__(self, cfg: HookedTransformerConfig, length: int | None = None):
        super().__init__(cfg, length)
        self.offset = cfg.norm_gain_offset
        self.fp32_in_float16 = cfg.norm_gain_fp32_in_float16
        self.w = nn.Parameter(self.cast_parameter("w", torch.ones(self.length), cfg.dtype))

    def _gain_in_fp32(self, dtype: torch.dtype) -> bool:
        return (bool(self.offset) and dtype in HALF_DTYPES) or (self.fp32_in_float16 and dtype == torch.float16)

    def cast_parameter(self, leaf: str, tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """`tensor` as stored in a `dtype` model: the gain `offset + w_hf` with `w_hf` rounded to `dtype`,
        in float32."""
        if leaf != "w" or not self._gain_in_fp32(dtype):
            return tensor.to(dtype)
        if not self.offset:
            return tensor.float()
        exact = tensor if tensor.dtype == torch.float64 else tensor.float()  # the loader's float64 `1 + w` is exact
        return (exact - self.offset).to(dtype).float() + self.offset

    def _apply(self, fn, recurse: bool = True):
        gain = self.w.data  # before `fn` (e.g. `.to(torch.bfloat16)`) rounds it
        super()._apply(fn, recurse)
        if self._gain_in_fp32(self.w.dtype):
            self.w.data = self.cast_parameter("w", gain.to(self.w.device), self.w.dtype)  # [length], float32
        return self

    def forward(self, x: Float[torch.Tensor, "... length"]) -> Float[torch.Tensor, "... length"]:
        if x.dtype == torch.float32:  # the cast is the identity: the plain RMSNorm is bit for bit the same
            return self.normalize(x) * self.w
        numerator, var = self.statistics(x.float())
        n32 = _normalize(self.hook_scale, numerator, var, self.eps)
        n32 = through_hook_normalized(self.hook_normalized, n32, x.dtype)
        return (n32 * self.w.float()).to(x.dtype)


NORMS = {"LN": LayerNorm, "LNPre": LayerNormPre, "RMS": RMSNorm, "RMSPre": RMSNormPre}


def make_norm(cfg: HookedTransformerConfig, kind: str | None = None, length: int | None = None) -> nn.Module:
    """The norm module for `kind` (default `cfg.normalization_type`); identity for None."""
    kind = cfg.normalization_type if kind is None else kind
    if kind is None:
        return nn.Identity()
    if kind == "RMS" and cfg.norm_gain_in_fp32:
        return RMSNormGainFirst(cfg, length)
    if kind == "LN" and cfg.norm_gain_in_fp32:  # Cohere
        return LayerNormGainFirst(cfg, length)
    return NORMS[kind](cfg, length)
