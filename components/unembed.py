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

    def forward(
        self, x: Float[torch.Tensor, "batch pos d_model"], logits_to_keep: int = 0
    ) -> Float[torch.Tensor, "batch pos d_vocab_out"]:
        """Logits of every position, or with `logits_to_keep=k` at least the last k.

        Positions before the last k are skipped only when nothing observes `hook_out`,
        so hooks always see the same activations whatever the caller keeps.
        """
        x = self.hook_in(x)
        if logits_to_keep and not self.hook_out.observed:
            x = x[:, -logits_to_keep:]  # [batch, logits_to_keep, d_model]
        flat = x.reshape(-1, x.shape[-1])  # [batch * pos, d_model]
        if self._bias_matters():
            flat_logits = torch.addmm(self.b_U, flat, self.W_U)
        else:  # a zero bias would cost a full extra pass over the [tokens, vocab] output
            flat_logits = flat @ self.W_U
        logits = self.hook_out(flat_logits.view(*x.shape[:-1], -1))  # [batch, pos, d_vocab_out]
        if self.soft_cap > 0:
            logits = self.soft_cap * torch.tanh(logits / self.soft_cap)
        return logits

    def _bias_matters(self) -> bool:
        return (self.b_U.requires_grad and torch.is_grad_enabled()) or bool(self.b_U.any())
