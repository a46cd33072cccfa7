"""Token and learned absolute position embeddings."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from jaxtyping import Float, Int

from hooked.config import HookedTransformerConfig


class Embed(nn.Module):
    """Token embedding: row `t` of `W_E [d_vocab, d_model]` for token `t`."""

    def __init__(self, cfg: HookedTransformerConfig):
        super().__init__()
        self.W_E = nn.Parameter(torch.empty(cfg.d_vocab, cfg.d_model, dtype=cfg.dtype))

    def forward(self, tokens: Int[torch.Tensor, "batch pos"]) -> Float[torch.Tensor, "batch pos d_model"]:
        return F.embedding(tokens, self.W_E)


class PosEmbed(nn.Module):
    """Learned absolute position embedding `W_pos [n_ctx, d_model]`, zero at padding."""

    def __init__(self, cfg: HookedTransformerConfig):
        super().__init__()
        self.n_ctx = cfg.n_ctx
        self.W_pos = nn.Parameter(torch.empty(cfg.n_ctx, cfg.d_model, dtype=cfg.dtype))

    def forward(
        self, positions: Int[torch.Tensor, "batch pos"], mask: Int[torch.Tensor, "batch pos"] | None = None
    ) -> Float[torch.Tensor, "batch pos d_model"]:
        if positions.numel() and int(positions.max()) >= self.n_ctx:
            raise ValueError(
                f"Position {int(positions.max())} is past n_ctx={self.n_ctx} learned positions; "
                "shorten the input (to_tokens(..., truncate=True) keeps the first n_ctx tokens)."
            )
        pos_embed = F.embedding(positions, self.W_pos)  # [batch or 1, pos, d_model]
        if mask is not None:
            pos_embed = pos_embed * mask[..., None].to(pos_embed.dtype)
        return pos_embed
