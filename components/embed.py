"""Token and learned absolute position embeddings.

With `cfg.post_embedding_ln` (Bloom) the token embedding is followed by its own LayerNorm,
`embed.ln`, whose `hook_scale`/`hook_normalized` fire before `hook_embed`. It is never folded:
it writes to the residual stream, nothing reads it.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from jaxtyping import Float, Int

from hooked.components.norms import LayerNorm
from hooked.core.config import HookedTransformerConfig


class Embed(nn.Module):
    """Token embedding: row `t` of `W_E [d_vocab, d_model]` for token `t` (then `ln`, if Bloom)."""

    def __init__(self, cfg: HookedTransformerConfig):
        super().__init__()
        self.W_E = nn.Parameter(torch.empty(cfg.d_vocab, cfg.d_model, dtype=cfg.dtype))
        if cfg.post_embedding_ln:
            self.ln = LayerNorm(cfg)

    def forward(self, tokens: Int[torch.Tensor, "batch pos"]) -> Float[torch.Tensor, "batch pos d_model"]:
        embed = F.embedding(tokens, self.W_E)  # [batch, pos, d_model]
        return self.ln(embed) if hasattr(self, "ln") else embed


class PosEmbed(nn.Module):
    """Learned absolute position embedding `W_pos [n_ctx, d_model]`, zero at padding."""

    def __init__(self, cfg: HookedTransformerConfig):
        super().__init__()
        self.n_ctx = cfg.n_ctx
        self.W_pos = nn.Parameter(torch.empty(cfg.n_ctx, cfg.d_model, dtype=cfg.dtype))

    def forward(
        self,
        tokens: Int[torch.Tensor, "batch pos"],
        past_kv_pos_offset: int = 0,
        attention_mask: Int[torch.Tensor, "batch offset_pos"] | None = None,
    ) -> Float[torch.Tensor, "batch pos d_model"]:
        """Position embeddings for a batch of tokens (TransformerLens's signature).

        Positions count from `past_kv_pos_offset`; with an `attention_mask` over cached and
        new positions they count real tokens only and are 0 at padding.
        """
        batch, n_new = tokens.shape[:2]
        if attention_mask is None:
            positions = torch.arange(past_kv_pos_offset, past_kv_pos_offset + n_new, device=self.W_pos.device)
            return self.at_positions(positions.expand(batch, n_new))
        mask = attention_mask.to(self.W_pos.device).long()  # [batch, offset_pos]
        positions = (mask.cumsum(-1) - 1).clamp(min=0)  # [batch, offset_pos]
        window = slice(past_kv_pos_offset, past_kv_pos_offset + n_new)
        return self.at_positions(positions[:, window], mask[:, window])

    def at_positions(
        self, positions: Int[torch.Tensor, "batch pos"], mask: Int[torch.Tensor, "batch pos"] | None = None
    ) -> Float[torch.Tensor, "batch pos d_model"]:
        """`W_pos[positions]`, zero where `mask` is 0 (the model's forward calls this)."""
        if torch.compiler.is_compiling():  # a device-side check: no host sync in a graph
            message = f"a position is past n_ctx={self.n_ctx} learned positions; shorten the input"
            torch._assert_async(  # pyright: ignore[reportPrivateImportUsage] - not in torch.__all__
                (positions < self.n_ctx).all(), message
            )
        elif positions.numel() and int(positions.max()) >= self.n_ctx:
            raise ValueError(
                f"Position {int(positions.max())} is past n_ctx={self.n_ctx} learned positions; "
                "shorten the input (to_tokens(..., truncate=True) keeps the first n_ctx tokens)."
            )
        pos_embed = F.embedding(positions, self.W_pos)  # [batch or 1, pos, d_model]
        if mask is not None:
            pos_embed = pos_embed * mask[..., None].to(pos_embed.dtype)
        return pos_embed
