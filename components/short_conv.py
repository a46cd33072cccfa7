"""LFM2's gated short convolution: an input-gated depthwise causal convolution, gated again on the way out.

    B, C, x = x W_in + b_in            input gate, output gate, value, [d_model] each
    y       = C * causal_conv(B * x)   (no activation; a window of `ssm_conv_kernel` positions)
    out     = y W_out + b_out

Its only state is the convolution's window: the last `kernel - 1` values of `B * x` (a generation
cache keeps them as `conv_state`). HF's `Lfm2ShortConv` PyTorch path, op for op.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from jaxtyping import Float

from hooked.components.causal_conv import CausalConv1d, mask_padding
from hooked.components.forward_state import ForwardState
from hooked.core.config import HookedTransformerConfig
from hooked.core.hook_points import HookPoint


class ShortConv(nn.Module):
    """LFM2's token mixer. Parameters: `W_in [d_model, 3 d_model]` (B, C, x), `b_in`, `conv.W [d_model, kernel]`,
    `conv.b`, `W_out [d_model, d_model]`, `b_out`."""

    #: the projections that read the block's `ln1` output (`fold_ln` folds its gain into them)
    NORM_READERS = ("W_in",)

    def __init__(self, cfg: HookedTransformerConfig, layer: int):
        super().__init__()
        self.cfg, self.layer = cfg, layer
        d, dt = cfg.d_model, cfg.dtype
        self.W_in = nn.Parameter(torch.empty(d, 3 * d, dtype=dt))
        self.b_in = nn.Parameter(torch.zeros(3 * d, dtype=dt))
        self.conv = CausalConv1d(d, cfg.ssm_conv_kernel, dt, act_fn=None)
        self.W_out = nn.Parameter(torch.empty(d, d, dtype=dt))
        self.b_out = nn.Parameter(torch.zeros(d, dtype=dt))
        self.hook_B = HookPoint()  # [batch, pos, d_model]: the input gate
        self.hook_C = HookPoint()  # [batch, pos, d_model]: the output gate
        self.hook_x = HookPoint()  # [batch, pos, d_model]: the gated value
        self.hook_conv_in = HookPoint()  # [batch, pos, d_model]: B * x, what the convolution reads
        self.hook_conv_out = HookPoint()  # [batch, pos, d_model]
        self.hook_gated = HookPoint()  # [batch, pos, d_model]: C * conv_out, read by W_out

    def forward(
        self, x: Float[torch.Tensor, "batch pos d_model"], state: ForwardState
    ) -> Float[torch.Tensor, "batch pos d_model"]:
        entry = state.past_kv_cache[self.layer] if state.past_kv_cache is not None else None
        mask = state.new_mask()
        projected = F.linear(mask_padding(x, mask), self.W_in.t(), self.b_in)  # [batch, pos, 3 d_model]
        B, C, xs = projected.chunk(3, dim=-1)
        B, C, xs = self.hook_B(B), self.hook_C(C), self.hook_x(xs)
        conv_in = self.hook_conv_in(mask_padding(B * xs, mask))  # a padded position writes nothing
        conv_out, conv_state = self.conv(conv_in, None if entry is None else entry.conv_state)
        if entry is not None:
            entry.store(conv_state, None)
        gated = self.hook_gated(C * self.hook_conv_out(conv_out))  # [batch, pos, d_model]
        return F.linear(gated, self.W_out.t(), self.b_out)
