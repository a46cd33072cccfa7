"""LAuReL (learned augmented residual layer, Gemma 3n): a low-rank linear path beside each attention.

    laurel(n) = n + ln(n W_left W_right)        n: the block's normalized active stream (ln1's output)

`W_left [d_model, rank]` and `W_right [rank, d_model]` have no biases; `ln` is an RMSNorm with a gain
of its own. The block adds it to the attention's update and divides the sum by sqrt(2).
`n` itself, gain included, joins the residual stream here, so `ln1`'s gain cannot be folded into the
weights that read it: `fold_ln` is skipped for Gemma 3n.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from jaxtyping import Float

from hooked.components.norms import make_norm
from hooked.core.config import HookedTransformerConfig
from hooked.core.hook_points import HookPoint
from hooked.core.validation import require_set


class Laurel(nn.Module):
    """`n + ln(n W_left W_right)`: the normalized input plus its normalized low-rank image."""

    def __init__(self, cfg: HookedTransformerConfig):
        super().__init__()
        rank = require_set(cfg.laurel_rank, "laurel_rank")
        self.W_left = nn.Parameter(torch.empty(cfg.d_model, rank, dtype=cfg.dtype))
        self.W_right = nn.Parameter(torch.empty(rank, cfg.d_model, dtype=cfg.dtype))
        self.ln = make_norm(cfg, "RMS")  # never folded: it normalizes this path's output
        self.hook_left = HookPoint()  # [batch, pos, rank]
        self.hook_out = HookPoint()  # [batch, pos, d_model]: ln(n W_left W_right), before n is added

    def forward(self, normed: Float[torch.Tensor, "batch pos d_model"]) -> Float[torch.Tensor, "batch pos d_model"]:
        left = self.hook_left(F.linear(normed, self.W_left.t()))  # [batch, pos, rank]
        return normed + self.hook_out(self.ln(F.linear(left, self.W_right.t())))
