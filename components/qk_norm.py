"""qk-norm: a norm of the queries and keys after projection, before rotary.

The kind follows the model's own norms: RMSNorm for RMS models, LayerNorm for LayerNorm
models (Phi's `qk_layernorm`: one LayerNorm shared by all heads; StableLM-2-12B with
`cfg.qk_norm_per_head`: separate `[head, d_head]` weights per head).

Two widths exist. Qwen3 and Gemma-3 normalize each head over `d_head` (one gain of
`[d_head]` shared by all heads). OLMo-2/3 and OLMoE normalize the whole projection over
`n_heads * d_head` before the head split (gains `[n_heads * d_head]`, `[n_kv_heads * d_head]`);
their hooks see `[batch, pos, 1]` / `[batch, pos, n_heads * d_head]`.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from jaxtyping import Float

from hooked.components.norms import (  # noqa: F401  (RMSNorm: importable from here before)
    LayerNorm,
    LayerNormPre,
    RMSNorm,
    RMSNormPre,
    gain_first_layer_norm,
    make_norm,
)
from hooked.core.config import HookedTransformerConfig


class PerHeadLayerNorm(LayerNormPre):
    """LayerNorm over `d_head` with separate weights per head: `normalized * w[h] + b[h]`.

    In half precision, unless a hook edits the normalized input, each head runs HF's fused
    `layer_norm` with its own gain and bias (as StableLM's `StableLmLayerNormPerHead`), which
    rounds once; float32 keeps the single `addcmul` over all heads. With `cfg.norm_gain_in_fp32`
    (Cohere) half precision computes HF's hand-written float32 LayerNorm instead.
    """

    def __init__(self, cfg: HookedTransformerConfig, n_heads: int):
        super().__init__(cfg, cfg.d_head)
        self.w = nn.Parameter(torch.ones(n_heads, cfg.d_head, dtype=cfg.dtype))
        self.b = nn.Parameter(torch.zeros(n_heads, cfg.d_head, dtype=cfg.dtype))
        self.gain_first = cfg.norm_gain_in_fp32  # Cohere: (w * n32 + b).to(dtype), HF's hand-written LayerNorm

    def forward(self, x: Float[torch.Tensor, "batch pos head d_head"]) -> Float[torch.Tensor, "batch pos head d_head"]:
        w, b = self.w, self.b  # [head, d_head]
        if x.shape[-2] != w.shape[0]:  # keys ungrouped to n_heads: each K/V head's weights serve its group
            repeats = x.shape[-2] // w.shape[0]
            w, b = w.repeat_interleave(repeats, dim=0), b.repeat_interleave(repeats, dim=0)
        if self.gain_first and x.dtype != torch.float32 and not self._needs_grad_hooks():
            return gain_first_layer_norm(self, x, w, b)
        fused = x.dtype != torch.float32 and x.dtype == w.dtype and not self._needs_grad_hooks()
        if fused and not (self.hook_scale.observed or self.hook_normalized.observed):
            return self.affine(x, w, b)
        normalized, edited = self.normalize_edit(x)  # the hooks see (and may edit) the normalized input
        if fused and not edited:
            return self.affine(x, w, b)
        return torch.addcmul(b, normalized, w)

    def _needs_grad_hooks(self) -> bool:
        return bool(self.hook_scale.needs_grad_path or self.hook_normalized.needs_grad_path)

    def affine(self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """One fused `layer_norm` per head with that head's gain and bias: [batch, pos, head, d_head]."""
        shape = (x.shape[-1],)
        return torch.stack([F.layer_norm(x[..., h, :], shape, w[h], b[h], self.eps) for h in range(x.shape[-2])], -2)


def make_qk_norm(cfg: HookedTransformerConfig, n_heads: int) -> LayerNormPre | RMSNormPre:
    """The q or k norm of one attention layer (`n_heads` = its query or key/value heads)."""
    if cfg.uses_layer_norm:
        return PerHeadLayerNorm(cfg, n_heads) if cfg.qk_norm_per_head else LayerNorm(cfg, cfg.d_head)
    width = n_heads * cfg.d_head if cfg.full_width_qk_norm else cfg.d_head
    norm = make_norm(cfg, "RMS", width)
    assert isinstance(norm, RMSNormPre)  # make_norm's "RMS" kind
    return norm


def apply_qk_norm(norm: LayerNormPre | RMSNormPre, x: Float[torch.Tensor, "batch pos head d_head"]) -> torch.Tensor:
    """`norm` per head (`norm.length == d_head`) or over all heads at once (full width)."""
    if norm.length == x.shape[-1]:
        return norm(x)
    flat = x.flatten(-2)  # [batch, pos, head * d_head]
    if flat.shape[-1] == norm.length:
        return norm(flat).view_as(x)
    # Ungrouped keys (`ungroup_grouped_query_attention`): each K/V head appears `repeats` times in a row.
    # The mean square over the copies is that over the originals, so normalize the originals and repeat.
    repeats = flat.shape[-1] // norm.length
    unique = x.unflatten(-2, (-1, repeats))[..., 0, :]  # [batch, pos, kv_head, d_head]
    return norm(unique.flatten(-2)).view_as(unique).repeat_interleave(repeats, dim=-2)
