"""Unembedding: the residual stream to logits over the vocabulary."""

from __future__ import annotations

import torch
import torch.nn as nn
from jaxtyping import Float

from hooked.config import HookedTransformerConfig
from hooked.hook_points import HookPoint


class Unembed(nn.Module):
    """`logits = x @ W_U + b_U`, then the optional soft-cap `c * tanh(logits / c)`.

    With tied embeddings `W_U` is a transposed view of `embed.W_E` (shared storage).
    `hook_out` is taken before the soft-cap.
    """

    def __init__(self, cfg: HookedTransformerConfig):
        super().__init__()
        self.soft_cap = cfg.output_logits_soft_cap
        self.W_U = nn.Parameter(torch.empty(cfg.d_model, cfg.d_vocab_out, dtype=cfg.dtype))
        self.b_U = nn.Parameter(torch.zeros(cfg.d_vocab_out, dtype=cfg.dtype))
        self.hook_in = HookPoint()  # [batch, pos, d_model]
        self.hook_out = HookPoint()  # [batch, pos, d_vocab_out]

    def forward(self, x: Float[torch.Tensor, "batch pos d_model"]) -> Float[torch.Tensor, "batch pos d_vocab_out"]:
        x = self.hook_in(x)
        logits = self.hook_out(torch.addmm(self.b_U, x.reshape(-1, x.shape[-1]), self.W_U).view(*x.shape[:-1], -1))
        if self.soft_cap > 0:
            logits = self.soft_cap * torch.tanh(logits / self.soft_cap)
        return logits
