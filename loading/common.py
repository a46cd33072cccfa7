"""Helpers shared by the architecture converters."""

from __future__ import annotations

from typing import Mapping

import torch

# HF `hidden_act` / `activation_function` names -> `cfg.act_fn`.
ACT_FN_NAMES = {"swish": "silu", "gelu_pytorch_tanh": "gelu_pytorch_tanh", "gelu_new": "gelu_new"}


class PrefixView(Mapping):
    """A read-only view of a state dict with a key prefix removed (lazy: nothing is loaded)."""

    def __init__(self, state: Mapping[str, torch.Tensor], prefix: str):
        self.state, self.prefix = state, prefix

    def __getitem__(self, key: str) -> torch.Tensor:
        if self.prefix + key in self.state:
            return self.state[self.prefix + key]
        return self.state[key]

    def __contains__(self, key) -> bool:
        return self.prefix + key in self.state or key in self.state

    def __iter__(self):
        return (k.removeprefix(self.prefix) for k in self.state)

    def __len__(self) -> int:
        return len(self.state)


def strip_prefix(state: Mapping[str, torch.Tensor], prefix: str) -> Mapping[str, torch.Tensor]:
    """Accept both `transformer.h.0...` (full model) and `h.0...` (base model) keys."""
    return PrefixView(state, prefix)


def heads_in(weight: torch.Tensor, n_heads: int, d_head: int) -> torch.Tensor:
    """HF Linear weight `[head*d_head, d_model]` -> `[head, d_model, d_head]` (a view)."""
    return weight.T.reshape(weight.shape[1], n_heads, d_head).permute(1, 0, 2)


def heads_out(weight: torch.Tensor, n_heads: int, d_head: int) -> torch.Tensor:
    """HF Linear weight `[d_model, head*d_head]` -> `[head, d_head, d_model]` (a view)."""
    return weight.T.reshape(n_heads, d_head, weight.shape[0])
