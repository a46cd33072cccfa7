"""`HookedTransformer.token_index`: padding-robust token positions."""

from __future__ import annotations

import torch
from jaxtyping import Int

from hooked.utils import token_index


class TokenIndexMixin:
    """Needs `self.forward_state` (set by every forward call)."""

    def token_index(
        self, idx: int | Int[torch.Tensor, "batch"], attention_mask: Int[torch.Tensor, "batch pos"] | None = None
    ) -> Int[torch.Tensor, "batch"]:
        """The absolute column of each row's logical token `idx`, for either padding side.

        Logical 0 is a row's first real token (BOS included) and -1 its last, so under left
        padding -1 is always column -1. Without `attention_mask`, the mask of the last
        forward call is used (all positions real when it had no padding).
        """
        if attention_mask is None:
            state = self.forward_state
            if state is None:
                raise ValueError("token_index needs attention_mask (or a previous forward call)")
            attention_mask = state.attention_mask
            if attention_mask is None:
                attention_mask = torch.ones(state.positions.shape[0], state.n_keys, dtype=torch.long)
        return token_index(idx, attention_mask)
