"""Rotary position embeddings (RoPE): rotate pairs of q/k dimensions by position-dependent angles.

Two pairings exist: NeoX's half split (dimension i pairs with i + rotary_dim/2) and
GPT-J's adjacent pairs (2i with 2i+1). Only the first `rotary_dim` dimensions rotate.
HuggingFace's `rope_scaling` variants reshape the frequencies: `linear`, `llama3` and
`yarn` once, at construction; `dynamic` (NTK) and `longrope` per call, from the total
sequence length. YaRN and LongRoPE also scale cos and sin by an attention factor. Gemma 4's
`proportional` rotates only the first `partial_rotary_factor` of the frequency pairs of the
whole head (pair i with i + d_head/2, frequency `base^(-2i/d_head)`) and leaves the rest
unrotated (frequency 0): a partial rotary spread over the head, not its first dims.
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


def rope_kind(scaling: dict | None) -> str:
    """The HF `rope_type` of a scaling dict (`default` for None)."""
    return (scaling or {}).get("rope_type", (scaling or {}).get("type", "default")) or "default"


def rotary_inv_freq(
    rotary_dim: int, base: float, scaling: dict | None = None, seq_len: int | None = None
) -> Float[torch.Tensor, "half"]:
    """Inverse frequencies `base^(-2i/rotary_dim)`, adjusted by an HF `rope_scaling` dict.

    `dynamic` and `longrope` depend on the total sequence length `seq_len` of the call
    (`max(position) + 1`; None = a short sequence): see `length_dependent`.
    """
    kind = rope_kind(scaling)
    _require_fields(kind, scaling)
    s = scaling or {}  # every kind but "default" has its fields (checked just above)
    # dynamic NTK raises the base (a 0-d tensor, as HF computes it) for long sequences
    call_base = _dynamic_ntk_base(rotary_dim, base, s, seq_len) if kind == "dynamic" else base
    exponents = torch.arange(0, rotary_dim, 2, dtype=torch.int64).float() / rotary_dim  # [half]
    inv_freq = 1.0 / (call_base**exponents)
    if kind in ("default", "dynamic"):
        return inv_freq
    if kind == "linear":
        return inv_freq / s["factor"]
    if kind == "llama3":
        return _llama3_inv_freq(inv_freq, s)
    if kind == "yarn":
        return _yarn_inv_freq(rotary_dim, base, s)
    if kind == "proportional":
        return _proportional_inv_freq(rotary_dim, base, s)
    if kind == "longrope":
        use_long = seq_len is not None and seq_len > s["original_max_position_embeddings"]
        factors = torch.tensor(s["long_factor" if use_long else "short_factor"], dtype=torch.float32)
        return 1.0 / (factors * base**exponents)
    raise NotImplementedError(
        f"rope_scaling type {kind!r} is not supported (supported: linear, llama3, yarn, dynamic, longrope, "
        "proportional)"
    )


_REQUIRED = {
    "linear": ("factor",),
    "llama3": ("factor",),
    "yarn": ("factor", "original_max_position_embeddings"),
    "dynamic": ("factor", "max_position_embeddings"),
    "longrope": ("short_factor", "long_factor", "original_max_position_embeddings"),
}


def _require_fields(kind: str, scaling: dict | None) -> None:
    missing = [k for k in _REQUIRED.get(kind, ()) if (scaling or {}).get(k) is None]
    if missing:
        raise ValueError(
            f"rotary_scaling of type {kind!r} needs {missing}; converters fill them from the HF config "
            "(loading.common.hf_rope_parameters), a hand-written config must set them"
        )


def length_dependent(scaling: dict | None) -> bool:
    """Whether the frequencies change with the total sequence length (`dynamic`, `longrope`)."""
    return rope_kind(scaling) in ("dynamic", "longrope")


def longrope_switches(cfg, n_cached: int, total: int) -> bool:
    """Whether decoding to `total` positions crosses LongRoPE's switch from short to long factors.

    The cached keys were rotated with the short factors; HF's Phi-3 `generate` then
    drops its cache and recomputes the whole sequence once, and so does hooked's.
    """
    scaling = cfg.rotary_scaling
    if not cfg.uses_rotary or rope_kind(scaling) != "longrope":
        return False
    original = scaling["original_max_position_embeddings"]
    return n_cached <= original < total


def rotary_attention_factor(scaling: dict | None) -> float:
    """The factor HF multiplies cos and sin by: YaRN's and LongRoPE's `attention_factor` (else 1)."""
    kind, s = rope_kind(scaling), scaling or {}
    if kind not in ("yarn", "longrope"):
        return 1.0
    if s.get("attention_factor") is not None:
        return float(s["attention_factor"])
    factor = s["factor"]
    if kind == "longrope":
        orig = s["original_max_position_embeddings"]
        return 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(orig))
    mscale, mscale_all_dim = s.get("mscale"), s.get("mscale_all_dim")
    if mscale and mscale_all_dim:
        return float(_yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all_dim))
    return _yarn_mscale(factor)


def _dynamic_ntk_base(rotary_dim: int, base: float, s: dict, seq_len: int | None) -> torch.Tensor | float:
    """Dynamic NTK: raise the base once the sequence outgrows `max_position_embeddings` (HF's float32 arithmetic)."""
    max_pos = s["max_position_embeddings"]
    if seq_len is None or seq_len <= max_pos:
        return base
    factor = s["factor"]
    seq = torch.tensor(seq_len)  # int64, as HF's `max(position_ids) + 1`
    return base * ((factor * seq / max_pos) - (factor - 1)) ** (rotary_dim / (rotary_dim - 2))


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn_inv_freq(dim: int, base: float, s: dict) -> torch.Tensor:
    """YaRN: interpolate low frequencies by `factor`, keep high ones, ramp linearly between."""
    factor, orig = s["factor"], s["original_max_position_embeddings"]
    beta_fast, beta_slow = s.get("beta_fast") or 32, s.get("beta_slow") or 1

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(orig / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if s.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # as HF: avoid a zero-width ramp
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)  # [half]
    pos_freqs = base ** (torch.arange(0, dim, 2).float() / dim)
    extrapolation = 1 - ramp
    return (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation


def _proportional_inv_freq(dim: int, base: float, s: dict) -> torch.Tensor:
    """Gemma 4: the first `int(partial_rotary_factor * dim // 2)` frequencies of a `dim`-wide rotary, zeros after."""
    rotated = int(s.get("partial_rotary_factor", 1.0) * dim // 2)
    exponents = torch.arange(0, 2 * rotated, 2, dtype=torch.int64).float() / dim  # [rotated]
    inv_freq = torch.cat([1.0 / (base**exponents), torch.zeros(dim // 2 - rotated)])  # [dim / 2]
    return inv_freq / s.get("factor", 1.0)


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
    positions: Int[torch.Tensor, "batch pos"],
    inv_freq: Float[torch.Tensor, "half"],
    adjacent: bool,
    dtype,
    attention_factor: float = 1.0,
) -> tuple[Float[torch.Tensor, "batch pos 1 rot"], Float[torch.Tensor, "batch pos 1 rot"]]:
    """cos and sin tables for the given positions, laid out to match the pairing (times YaRN/LongRoPE's factor)."""
    angles = positions[..., None].float() * inv_freq  # [batch, pos, rot/2]
    # [batch, pos, rot]: adjacent (θ0, θ0, θ1, θ1, ...), else halves (θ0..θn, θ0..θn)
    angles = angles.repeat_interleave(2, dim=-1) if adjacent else torch.cat([angles, angles], dim=-1)
    cos, sin = angles.cos(), angles.sin()
    if attention_factor != 1.0:
        cos, sin = cos * attention_factor, sin * attention_factor
    return cos.to(dtype)[:, :, None], sin.to(dtype)[:, :, None]


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def _rotate_adjacent(x: torch.Tensor) -> torch.Tensor:
    pairs = x.unflatten(-1, (-1, 2))  # [..., rot/2, 2]
    return torch.stack([-pairs[..., 1], pairs[..., 0]], dim=-1).flatten(-2)


def apply_rotary(
    x: Float[torch.Tensor, "batch pos head d_head"],
    cos: Float[torch.Tensor, "#batch pos 1 rot"],
    sin: Float[torch.Tensor, "#batch pos 1 rot"],
    adjacent: bool = False,
) -> Float[torch.Tensor, "batch pos head d_head"]:
    """Rotate the first `rot` dimensions of each head; the rest pass through."""
    rot = cos.shape[-1]
    if rot == x.shape[-1]:  # full rotary: no pass-through part to split off and re-attach
        return x * cos + (_rotate_adjacent(x) if adjacent else _rotate_half(x)) * sin
    x_rot, x_pass = x[..., :rot], x[..., rot:]
    rotated = x_rot * cos + (_rotate_adjacent(x_rot) if adjacent else _rotate_half(x_rot)) * sin
    return torch.cat([rotated, x_pass], dim=-1)


def apply_rotary_interleaved(
    x: Float[torch.Tensor, "batch pos head rot"],
    cos: Float[torch.Tensor, "#batch pos 1 rot"],
    sin: Float[torch.Tensor, "#batch pos 1 rot"],
) -> Float[torch.Tensor, "batch pos head rot"]:
    """DeepSeek-V3's rotation (`cfg.rotary_interleaved_input`): adjacent pairs in, two halves out.

    Pair i is `(x[2i], x[2i+1])`; the result holds every pair's rotated first element, then
    every rotated second one, as HF's `apply_rotary_pos_emb_interleave`. The tables are the
    half-split ones (`rotary_cos_sin(..., adjacent=False)`), whose first half has each pair's angle.
    """
    half = cos.shape[-1] // 2
    cos, sin = cos[..., :half], sin[..., :half]  # [batch, pos, 1, rot/2]
    x1, x2 = x[..., 0::2], x[..., 1::2]  # [batch, pos, head, rot/2]: each pair's first and second element
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
