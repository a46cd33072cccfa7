"""Attention with an output gate (Qwen3-Next, Qwen3.5): each head's output is scaled by a gate of the input.

    gate = sigmoid(x W_gate + b_gate)           per head, [batch, pos, head, d_head]
    z    = (pattern @ v) * gate                 what `W_O` reads (`hook_z` is the gated value)

HF computes the gate in the same projection as the queries (`q_proj` yields `[q, gate]` per head);
the converter splits it into `W_Q` and `W_gate`.
"""

from __future__ import annotations

import torch
import torch.nn as nn
from jaxtyping import Float

from hooked.components.attention import Attention, GroupedQueryAttention, head_major, project
from hooked.core.config import HookedTransformerConfig
from hooked.core.hook_points import HookPoint


class OutputGate:
    """Mixin of an attention class: `W_gate [head, d_model, d_head]`, `b_gate`, and `hook_gate`."""

    W_gate: nn.Parameter
    b_gate: nn.Parameter
    hook_gate: HookPoint

    def _init_gate(self, cfg: HookedTransformerConfig) -> None:
        H, d, dh, dt = cfg.n_heads, cfg.d_model, cfg.d_head, cfg.dtype
        self.W_gate = nn.Parameter(head_major(H, d, dh, dt))
        self.b_gate = nn.Parameter(torch.zeros(H, dh, dtype=dt))
        self.hook_gate = HookPoint()  # [batch, pos, head, d_head]: sigmoid(x W_gate + b_gate)

    def _gate_z(self, z: Float[torch.Tensor, "batch pos head d_head"], query_input: torch.Tensor) -> torch.Tensor:
        gate = self.hook_gate(torch.sigmoid(project(query_input, self.W_gate, self.b_gate)))  # [b, pos, head, d_head]
        return z * gate


class GatedAttention(OutputGate, Attention):
    """Multi-head attention with an output gate."""

    def __init__(self, cfg: HookedTransformerConfig | dict, layer: int = 0):
        super().__init__(cfg, layer)
        self._init_gate(self.cfg)


class GatedGroupedQueryAttention(OutputGate, GroupedQueryAttention):
    """Grouped-query attention with an output gate (Qwen3-Next's and Qwen3.5's full-attention layers)."""

    def __init__(self, cfg: HookedTransformerConfig | dict, layer: int = 0):
        super().__init__(cfg, layer)
        self._init_gate(self.cfg)


def gated_attention_class(cfg: HookedTransformerConfig) -> type[Attention]:
    return GatedGroupedQueryAttention if cfg.uses_grouped_query_attention else GatedAttention
