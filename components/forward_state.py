"""`ForwardState`: what every layer needs to know about the current forward call.

The model builds one per call and publishes it as `model.forward_state`, so hooks can
read the padding mask, positions and generation step of the call they fire in.
Attention masks are built here, per call and lazily, never as an `n_ctx²` buffer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from jaxtyping import Bool, Float, Int


@dataclass
class ForwardState:
    """Masks, positions and KV cache of one forward call.

    Attributes:
        attention_mask: `[batch, n_keys]`, 1 for real tokens over all keys (cached +
            new), or None when nothing is padded.
        positions: `[batch or 1, n_queries]` position ids of the new tokens.
        n_queries, n_keys: new positions in this call; cached + new positions.
        causal: False for bidirectional attention.
        step: 0 for a prefill, t for the t-th generated token (None inside a compiled decode step).
        past_kv_cache: the `HookedTransformerKeyValueCache` in use, if any.
        tokens: the input tokens, when the call started from tokens.
        query_columns: `[n_queries]` key columns the new positions are written to; None
            means the last `n_queries` of the `n_keys` columns. A static KV cache (fixed
            `n_keys`, filled from the left) sets it, as a device tensor.
        step_index: with a static KV cache, `step` as a 0-d device tensor, for hooks that
            run inside a compiled decode step (where `step` is None: a Python int there
            would be baked into the graph).
        per_layer_inputs: Gemma 3n/4's per-layer inputs `[batch, pos, n_layers, d_per_layer_input]`
            of this call (`per_layer_embed`), which block l reads at index l.
        shared_kv: the keys and values `[batch, n_keys, kv_head, d_head]` each layer lends to later
            layers this call (`cfg.kv_shared_from`), by lending layer.
        key_blocks: `[batch, n_keys]` ids of bidirectional blocks, -1 elsewhere: a causal query
            also sees every key of its own block (Gemma 3's images); a bidirectional query sees
            only its own block's keys (Qwen2.5-VL's vision windows); None: no blocks.
        rotary_tables: `(cos, sin)` `[batch or 1, n_queries, 1, rot]` the model built from
            positions of its own (Qwen2.5-VL's 2-D and 3-D rotary): every rotary layer uses
            them instead of tables from `positions`; None: from `positions`.
    """

    attention_mask: Int[torch.Tensor, "batch n_keys"] | None
    positions: Int[torch.Tensor, "batch n_queries"]
    n_queries: int
    n_keys: int
    causal: bool = True
    step: int | None = 0
    past_kv_cache: Any = None
    tokens: Int[torch.Tensor, "batch n_queries"] | None = None
    query_columns: Int[torch.Tensor, "n_queries"] | None = None
    step_index: Int[torch.Tensor, ""] | None = None
    per_layer_inputs: Float[torch.Tensor, "batch n_queries n_layers d_per_layer"] | None = None
    shared_kv: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    key_blocks: Int[torch.Tensor, "batch n_keys"] | None = None
    rotary_tables: tuple[torch.Tensor, torch.Tensor] | None = None
    _memo: dict = field(default_factory=dict, repr=False)

    @classmethod
    def for_input(
        cls,
        batch: int,
        n_queries: int,
        device: torch.device | str,
        attention_mask: Int[torch.Tensor, "batch pos"] | None = None,
        causal: bool = True,
    ) -> ForwardState:
        """The state of a plain uncached forward over `n_queries` positions.

        Used when a block or attention layer is called on its own, TransformerLens-style
        (`block(resid_pre)`, `attn(q_in, k_in, v_in)`), without the model building a state.
        """
        if attention_mask is None or bool(attention_mask.all()):
            positions = torch.arange(n_queries, device=device).expand(batch, n_queries)  # [batch, pos]
            return cls(None, positions, n_queries, n_queries, causal)
        mask = attention_mask.to(device).long()  # [batch, pos]
        positions = (mask.cumsum(-1) - 1).clamp(min=0)  # [batch, pos]
        return cls(mask, positions, n_queries, n_queries, causal)

    def to(self, device: torch.device | str, non_blocking: bool = False) -> ForwardState:
        """This state with its masks and positions on `device`, made once per call and device.

        Blocks placed on another device (a split or offloaded model) get it from accelerate's
        input hooks, with their own rotary tables and masks; the KV cache is shared, not moved.
        """
        device = torch.device(device)
        if self.positions.device == device:
            return self
        return self.memo(("on", device), lambda: self._copy_to(device, non_blocking))

    def _copy_to(self, device: torch.device, non_blocking: bool) -> ForwardState:
        move = lambda t: None if t is None else t.to(device, non_blocking=non_blocking)  # noqa: E731
        return replace(
            self,
            attention_mask=move(self.attention_mask),
            positions=move(self.positions),
            tokens=move(self.tokens),
            query_columns=move(self.query_columns),
            step_index=move(self.step_index),
            per_layer_inputs=move(self.per_layer_inputs),
            key_blocks=move(self.key_blocks),
            rotary_tables=None
            if self.rotary_tables is None
            else (move(self.rotary_tables[0]), move(self.rotary_tables[1])),
            _memo={},
        )

    def memo(self, key: Any, make: Callable[[], Any]) -> Any:
        """Compute something once per call (rotary tables, masks) and share it across layers."""
        if key not in self._memo:
            self._memo[key] = make()
        return self._memo[key]

    def allowed(self, window: int | None = None) -> Bool[torch.Tensor, "batch 1 n_queries n_keys"] | None:
        """Which keys each query may attend to (True = attend); None when all may."""
        return self.memo(("allowed", window), lambda: self._build_allowed(window))

    def _build_allowed(self, window: int | None):
        device = self.positions.device
        q_col = self.query_column_ids()[:, None]  # [q, 1]
        k_col = torch.arange(self.n_keys, device=device)[None, :]  # [1, k]
        allowed = None
        if self.causal and self.n_queries > 1 or window is not None or self.key_blocks is not None:
            allowed = k_col <= q_col if self.causal else torch.ones_like(k_col <= q_col)
            allowed = allowed[None, None]  # [1, 1, q, k]
            if self.key_blocks is not None:  # causal OR same block, then the window (HF's Gemma 3 order)
                same = self._same_block(q_col[:, 0])
                allowed = allowed | same if self.causal else same  # bidirectional: within the block only
            if window is not None:
                allowed = allowed & (k_col > q_col - window)
        if self.attention_mask is not None:
            keys = self.attention_mask.bool()[:, None, None, :]  # [batch, 1, 1, k]
            allowed = keys if allowed is None else allowed & keys
        return allowed

    def _same_block(self, q_col: Int[torch.Tensor, "n_queries"]) -> Bool[torch.Tensor, "batch 1 n_queries n_keys"]:
        """Query and key lie in the same bidirectional block (never for -1, the keys outside every block)."""
        assert self.key_blocks is not None  # called only when there are blocks
        blocks = self.key_blocks.to(q_col.device)  # [batch, n_keys]
        q_blocks = blocks.index_select(1, q_col)  # [batch, n_queries]
        same = (q_blocks[:, :, None] == blocks[:, None, :]) & (q_blocks[:, :, None] >= 0)  # [batch, q, k]
        return same[:, None]  # [batch, 1, q, k]

    def query_column_ids(self) -> Int[torch.Tensor, "n_queries"]:
        """The key columns of the new positions: the last `n_queries` unless `query_columns` says otherwise."""
        if self.query_columns is not None:
            return self.query_columns
        return torch.arange(self.n_keys - self.n_queries, self.n_keys, device=self.positions.device)

    def new_mask(self) -> Int[torch.Tensor, "batch n_queries"] | None:
        """The attention mask of the new positions only (None when nothing is padded)."""
        if self.attention_mask is None:
            return None
        if self.query_columns is not None:
            return self.attention_mask.index_select(1, self.query_columns)  # [batch, n_queries]
        return self.attention_mask[:, -self.n_queries :]

    def sdpa_mask(self, window: int | None = None) -> tuple[torch.Tensor | None, bool]:
        """`(attn_mask, is_causal)` for `scaled_dot_product_attention`."""
        plain = self.attention_mask is None and self.key_blocks is None
        if self.causal and window is None and plain and self.n_queries == self.n_keys:
            if self.n_queries > 1:  # a branch, not a value: SDPA needs a plain bool, even for symbolic sizes
                return None, True
            return None, False
        return self.allowed(window), False

    def valid_queries(self, window: int | None = None) -> Bool[torch.Tensor, "batch 1 n_queries 1"] | None:
        """False for queries that see no key at all (left-padding positions); None if every query sees one."""
        if self.attention_mask is None:
            return None

        def valid() -> torch.Tensor:
            allowed = self.allowed(window)
            assert allowed is not None  # with an attention mask there is always a table
            return allowed.any(-1, keepdim=True)

        return self.memo(("valid", window), valid)
