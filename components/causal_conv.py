"""The depthwise causal convolution that every recurrent mixer runs over positions before its scan.

    out[t, c] = act(b[c] + sum_i W[c, i] * x[t - k + 1 + i, c])      (k = `ssm_conv_kernel`)

Each channel has its own short filter over the last k positions. A generation cache keeps the
last k - 1 inputs (`conv_state`, `[batch, k - 1, channels]`), so a decode step sees the same
window as a full forward; positions before the first are zeros, as HF's left padding of the
convolution. The arithmetic is HF's `F.conv1d` call (its PyTorch fallback for `causal_conv1d`).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from jaxtyping import Float

from hooked.components.activations import get_activation


class CausalConv1d(nn.Module):
    """A depthwise causal convolution, `W [channels, kernel]` and `b [channels]`, then an optional activation."""

    def __init__(self, channels: int, kernel: int, dtype: torch.dtype, act_fn: str | None = None):
        super().__init__()
        self.W = nn.Parameter(torch.empty(channels, kernel, dtype=dtype))
        self.b = nn.Parameter(torch.zeros(channels, dtype=dtype))
        self.kernel = kernel
        self.act = None if act_fn is None else get_activation(act_fn)

    def forward(
        self,
        x: Float[torch.Tensor, "batch pos channels"],
        conv_state: Float[torch.Tensor, "batch _window channels"] | None = None,
    ) -> tuple[Float[torch.Tensor, "batch pos channels"], Float[torch.Tensor, "batch _window channels"]]:
        """`(out, new_state)`: the convolved positions, and the last `kernel - 1` inputs (what a cache keeps).

        With `conv_state` (the inputs before `x`) the window continues from it; without, it starts on zeros.
        """
        batch, n_pos, channels = x.shape
        seq = x.transpose(1, 2).to(self.W.dtype)  # [batch, channels, pos]
        weight = self.W.unsqueeze(1)  # [channels, 1, kernel]
        if conv_state is None:
            out = F.conv1d(seq, weight, self.b, padding=self.kernel - 1, groups=channels)[..., :n_pos]
            history = F.pad(seq, (max(self.kernel - 1 - n_pos, 0), 0))  # [batch, channels, >= kernel - 1]
        else:
            history = torch.cat([conv_state.transpose(1, 2).to(seq.dtype), seq], dim=-1)  # [b, ch, k - 1 + pos]
            out = F.conv1d(history, weight, self.b, groups=channels)  # [batch, channels, pos]
        if self.act is not None:
            out = self.act(out)
        new_state = history[..., history.shape[-1] - (self.kernel - 1) :].transpose(1, 2)  # [batch, k - 1, channels]
        return out.to(x.dtype).transpose(1, 2), new_state  # [batch, pos, channels]


def mask_padding(
    x: Float[torch.Tensor, "batch pos d"], new_mask: torch.Tensor | None
) -> Float[torch.Tensor, "batch pos d"]:
    """Zero the left-padding positions, so they never write a state.

    HF's `apply_mask_to_padding_states` zeroes the mixer's input (and Mamba-2's convolution output);
    the mixers here also zero what enters the convolution, so a projection's bias at a padded position
    never reaches the window of the first real tokens. Without such a bias (every released Mamba,
    Mamba-2, Nemotron-H, Granite-hybrid, Qwen3-Next and LFM2 checkpoint) the two agree exactly.
    """
    if new_mask is None:
        return x
    return (x * new_mask[:, :, None]).to(x.dtype)
