"""KV cache for incremental decoding: keys (already rotated) and values of every position so far.

Each layer's entry owns a preallocated buffer that grows geometrically, so appending
a token is a slice write, not a `torch.cat` of the whole history. The cache also keeps
the attention mask of every cached position, from which the next position ids follow.
"""

from __future__ import annotations

import copy

import torch
from jaxtyping import Float, Int


class HookedTransformerKeyValueCacheEntry:
    """One layer's cached keys and values, `[batch, pos_so_far, kv_head, d_head]` views of a buffer."""

    def __init__(
        self, batch_size: int, n_heads: int, d_head: int, device=None, dtype=torch.float32, frozen=False, capacity=0
    ):
        self.frozen = frozen
        self._keys = torch.empty(batch_size, capacity, n_heads, d_head, device=device, dtype=dtype)
        self._values = torch.empty_like(self._keys)
        self.length = 0

    @property
    def past_keys(self) -> Float[torch.Tensor, "batch pos kv_head d_head"]:
        return self._keys[:, : self.length]

    @property
    def past_values(self) -> Float[torch.Tensor, "batch pos kv_head d_head"]:
        return self._values[:, : self.length]

    def update(
        self,
        keys: Float[torch.Tensor, "batch new kv_head d_head"],
        values: Float[torch.Tensor, "batch new kv_head d_head"],
    ) -> tuple[Float[torch.Tensor, "batch pos kv_head d_head"], Float[torch.Tensor, "batch pos kv_head d_head"]]:
        """Keys and values of all positions (cached + new); stores the new ones unless frozen."""
        if self._keys.device != keys.device:  # a split model: the entry lives with its layer
            self._keys, self._values = self._keys.to(keys.device), self._values.to(keys.device)
        if self.frozen:
            return torch.cat([self.past_keys, keys], dim=1), torch.cat([self.past_values, values], dim=1)
        new_len = self.length + keys.shape[1]
        if new_len > self._keys.shape[1]:
            self._grow(max(new_len, 2 * self._keys.shape[1], 16), keys)
        self._keys[:, self.length : new_len] = keys
        self._values[:, self.length : new_len] = values
        self.length = new_len
        return self.past_keys, self.past_values

    def _grow(self, capacity: int, like: torch.Tensor) -> None:
        b, _, h, dh = like.shape
        keys = like.new_empty(b, capacity, h, dh)
        values = like.new_empty(b, capacity, h, dh)
        keys[:, : self.length] = self.past_keys
        values[:, : self.length] = self.past_values
        self._keys, self._values = keys, values

    def clone(self) -> HookedTransformerKeyValueCacheEntry:
        new = copy.copy(self)
        new._keys, new._values = self._keys.clone(), self._values.clone()
        return new


class HookedTransformerKeyValueCache:
    """Per-layer KV entries plus the attention mask of the cached positions.

    A frozen cache is read but never extended: every forward attends to the cached
    prefix plus its own tokens, so one prefix can serve many continuations.
    """

    def __init__(self, entries: list[HookedTransformerKeyValueCacheEntry], previous_attention_mask, frozen=False):
        self.entries = entries
        self.previous_attention_mask = previous_attention_mask
        self.frozen = frozen
        self.n_forwards = 0

    @classmethod
    def init_cache(cls, cfg, device=None, batch_size: int = 1, *, capacity: int = 0) -> HookedTransformerKeyValueCache:
        """An empty cache; `capacity` preallocates that many positions (it still grows past them)."""
        heads = cfg.n_heads if cfg.ungroup_grouped_query_attention else cfg.n_kv_heads
        device = cfg.device if device is None else device
        entries = [
            HookedTransformerKeyValueCacheEntry(batch_size, heads, cfg.d_head, device, cfg.dtype, capacity=capacity)
            for _ in range(cfg.n_layers)
        ]
        return cls(entries, torch.empty(batch_size, 0, dtype=torch.long, device=device))

    def __getitem__(self, layer: int) -> HookedTransformerKeyValueCacheEntry:
        return self.entries[layer]

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def n_cached(self) -> int:
        return self.previous_attention_mask.shape[1]

    def append_attention_mask(self, mask: Int[torch.Tensor, "batch new"]) -> Int[torch.Tensor, "batch pos"]:
        """The mask over cached + new positions; stored unless the cache is frozen."""
        full = torch.cat([self.previous_attention_mask, mask.to(self.previous_attention_mask)], dim=1)
        if not self.frozen:
            self.previous_attention_mask = full
        return full

    def freeze(self) -> None:
        self.frozen = True
        for entry in self.entries:
            entry.frozen = True

    def unfreeze(self) -> None:
        self.frozen = False
        for entry in self.entries:
            entry.frozen = False

    def clone(self) -> HookedTransformerKeyValueCache:
        new = HookedTransformerKeyValueCache([e.clone() for e in self.entries], self.previous_attention_mask.clone())
        new.frozen, new.n_forwards = self.frozen, self.n_forwards
        return new


# TransformerLens 3.x names
TransformerLensKeyValueCache = HookedTransformerKeyValueCache
TransformerLensKeyValueCacheEntry = HookedTransformerKeyValueCacheEntry
