"""Rotary position embeddings (RoPE): rotate pairs of q/k dimensions by position-dependent angles.

Two pairings exist: NeoX's half split (dimension i pairs with i + rotary_dim/2) and
GPT-J's adjacent pairs (2i with 2i+1). Only the first `rotary_dim` dimensions rotate.
HuggingFace's `rope_scaling` variants reshape the frequencies once, at construction.
"""

from __future__ import annotations

import math

import torch
from jaxtyping import Float, Int


def layer_rotary_parameters(cfg, is_local: bool) -> tuple[float, dict | None]:
    """`(base, scaling)` of a layer's rotary: per layer type, as Gemma 3 and OLMo 3 configure it.

    Local (sliding-window) layers have rotary parameters of their own when
    `cfg.rotary_base_local` is set: that base with `cfg.rotary_scaling_local` (None =
    unscaled). Every other layer uses `cfg.rotary_base` with `cfg.rotary_scaling`.
    """
    if is_local and cfg.rotary_base_local:
        return cfg.rotary_base_local, cfg.rotary_scaling_local
    return cfg.rotary_base, cfg.rotary_scaling


def rotary_inv_freq(rotary_dim: int, base: float, scaling: dict | None = None) -> Float[torch.Tensor, "half"]:
    """Inverse frequencies `base^(-2i/rotary_dim)`, adjusted by an HF `rope_scaling` dict."""
    inv_freq = 1.0 / (base ** (torch.arange(0, rotary_dim, 2, dtype=torch.int64).float() / rotary_dim))
    kind = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
    if kind in ("default", None):
        return inv_freq
    if kind == "linear":
        return inv_freq / scaling["factor"]
    if kind == "llama3":
        return _llama3_inv_freq(inv_freq, scaling)
    raise NotImplementedError(f"rope_scaling type {kind!r} is not supported (supported: linear, llama3)")


def _llama3_inv_freq(inv_freq: torch.Tensor, s: dict) -> torch.Tensor:
    """Llama 3.1's NTK-by-parts: slow long wavelengths down, keep short ones, blend between."""
    factor, low, high = s["factor"], s.get("low_freq_factor", 1.0), s.get("high_freq_factor", 4.0)
    old_ctx = s.get("original_max_position_embeddings", 8192)
    low_freq_wavelen, high_freq_wavelen = old_ctx / low, old_ctx / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_ctx / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) & ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def rotary_cos_sin(
    positions: Int[torch.Tensor, "batch pos"], inv_freq: Float[torch.Tensor, "half"], adjacent: bool, dtype
) -> tuple[Float[torch.Tensor, "batch pos 1 rot"], Float[torch.Tensor, "batch pos 1 rot"]]:
    """cos and sin tables for the given positions, laid out to match the pairing."""
    angles = positions[..., None].float() * inv_freq  # [batch, pos, rot/2]
    if adjacent:
        angles = angles.repeat_interleave(2, dim=-1)  # [batch, pos, rot]: (θ0, θ0, θ1, θ1, ...)
    else:
        angles = torch.cat([angles, angles], dim=-1)  # [batch, pos, rot]: (θ0..θn, θ0..θn)
    return angles.cos().to(dtype)[:, :, None], angles.sin().to(dtype)[:, :, None]


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def _rotate_adjacent(x: torch.Tensor) -> torch.Tensor:
    pairs = x.unflatten(-1, (-1, 2))  # [..., rot/2, 2]
    return torch.stack([-pairs[..., 1], pairs[..., 0]], dim=-1).flatten(-2)


def apply_rotary(
    x: Float[torch.Tensor, "batch pos head d_head"],
    cos: Float[torch.Tensor, "batch pos 1 rot"],
    sin: Float[torch.Tensor, "batch pos 1 rot"],
    adjacent: bool = False,
) -> Float[torch.Tensor, "batch pos head d_head"]:
    """Rotate the first `rot` dimensions of each head; the rest pass through."""
    rot = cos.shape[-1]
    if rot == x.shape[-1]:  # full rotary: no pass-through part to split off and re-attach
        return x * cos + (_rotate_adjacent(x) if adjacent else _rotate_half(x)) * sin
    x_rot, x_pass = x[..., :rot], x[..., rot:]
    rotated = x_rot * cos + (_rotate_adjacent(x_rot) if adjacent else _rotate_half(x_rot)) * sin
    return torch.cat([rotated, x_pass], dim=-1)
