"""KV sharing across layers (Gemma 3n, Gemma 4): a layer attends to an earlier layer's keys and values.

The last layers of those models compute queries only. Layer l with `cfg.kv_shared_from[l] = s`
attends to layer s's keys and values as layer s attends to them: rotated, normalized and, when
decoding, with the cached positions included (the lending layer leaves them in
`ForwardState.shared_kv` after its own cache update). Such a layer has no `W_K`/`W_V`, no
`k_norm` and no `hook_k`/`hook_v`/`hook_rot_k`, and never writes its KV cache entry (it stays
empty): a hook on the lending layer's keys or values changes what both layers attend to, as in HF.
The config refuses sharing that this class cannot compute (`HookedTransformerConfig._check_kv_sharing`):
a lender that borrows itself, a lender of another shape, MLA or output-gated attention.
"""

from __future__ import annotations

import torch

from hooked.components.attention import Attention, project
from hooked.components.forward_state import ForwardState
from hooked.components.qk_norm import apply_qk_norm
from hooked.core.config import HookedTransformerConfig


class SharedKVAttention(Attention):
    """Attention with queries of its own and the keys and values of layer `cfg.kv_shared_from[layer]`."""

    def __init__(self, cfg: HookedTransformerConfig, layer: int = 0):
        super().__init__(cfg, layer)
        source = cfg.kv_source(layer)
        assert source is not None  # `attention_class` picks this class only for sharing layers
        self.kv_source = source
        for name in ("k_norm", "hook_k", "hook_v", "hook_rot_k", "v_norm"):
            if hasattr(self, name):
                delattr(self, name)

    def _init_kv(self, cfg: HookedTransformerConfig) -> None:
        """No key or value weights: they are the lending layer's."""

    def kv_weights(self, n_heads: int):
        raise AttributeError(
            f"layer {self.layer} has no W_K/W_V: it attends to layer {self.kv_source}'s keys and values"
        )

    def _qkv(
        self, query_input: torch.Tensor, key_input: torch.Tensor, value_input: torch.Tensor, state: ForwardState
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries through this layer's hooks; keys and values `[batch, n_keys, kv_head, d_head]` as lent."""
        cfg = self.cfg
        q = self.hook_q(project(query_input, self.W_Q, self.b_Q, cfg.bias_after_matmul))  # [batch, pos, head, d_head]
        if cfg.use_qk_norm and not cfg.qk_norm_after_rotary:
            q = apply_qk_norm(self.q_norm, q)
        if cfg.clip_qkv is not None:
            q = q.clamp(-cfg.clip_qkv, cfg.clip_qkv)
        if self.rotary:
            cos, sin = self._rotary_tables(state, q.dtype)
            q = self.hook_rot_q(self._rotate(q, cos, sin))
        if cfg.use_qk_norm and cfg.qk_norm_after_rotary:
            q = apply_qk_norm(self.q_norm, q)
        if self.kv_source not in state.shared_kv:
            raise RuntimeError(
                f"layer {self.layer} attends to layer {self.kv_source}'s keys and values, which did not run in this "
                "forward: start_at_layer must not skip a lending layer of a KV-sharing model"
            )
        k, v = state.shared_kv[self.kv_source]  # [batch, n_keys, kv_head, d_head]
        return q, k, v
