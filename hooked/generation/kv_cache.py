"""KV cache for incremental decoding: keys (already rotated) and values of every position so far.

Each layer's entry owns a preallocated buffer that grows geometrically, so appending
a token is a slice write, not a `torch.cat` of the whole history. The cache also keeps
the attention mask of every cached position, from which the next position ids follow.
"""

from __future__ import annotations

import copy

import torch
from jaxtyping import Float, Int

from hooked.generation.recurrent_cache import RecurrentStateEntry


class HookedTransformerKeyValueCacheEntry:
    """One layer's cached keys and values, `[batch, pos_so_far, kv_head, d_head]` views of a buffer.

    Values may be narrower or wider than keys (`d_value`). Multi-head latent attention stores its
    KV latent as the keys and its shared rotary key as the values (`cfg.kv_cache_entry_shape(layer)`);
    other per-position tensors (DSA's indexer keys) are named `streams`, grown by `append`.
    """

    def __init__(
        self,
        batch_size: int,
        n_heads: int,
        d_head: int,
        device=None,
        dtype=torch.float32,
        frozen=False,
        capacity=0,
        d_value: int | None = None,
    ):
        self.frozen = frozen
        self._keys = torch.empty(batch_size, capacity, n_heads, d_head, device=device, dtype=dtype)
        self._values = torch.empty(batch_size, capacity, n_heads, d_value or d_head, device=device, dtype=dtype)
        self.length = 0
        self.streams: dict[str, torch.Tensor] = {}

    @property
    def past_keys(self) -> Float[torch.Tensor, "batch pos kv_head d_head"]:
        return self._keys[:, : self.length]

    @property
    def past_values(self) -> Float[torch.Tensor, "batch pos kv_head d_value"]:
        return self._values[:, : self.length]

    def update(
        self,
        keys: Float[torch.Tensor, "batch new kv_head d_head"],
        values: Float[torch.Tensor, "batch new kv_head d_value"],
    ) -> tuple[Float[torch.Tensor, "batch pos kv_head d_head"], Float[torch.Tensor, "batch pos kv_head d_value"]]:
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
        values = like.new_empty(b, capacity, h, self._values.shape[-1])
        keys[:, : self.length] = self.past_keys
        values[:, : self.length] = self.past_values
        self._keys, self._values = keys, values

    def append(self, name: str, new: Float[torch.Tensor, "batch new ..."]) -> Float[torch.Tensor, "batch pos ..."]:
        """Stream `name` of every position so far (cached + `new`); stores the new positions unless frozen."""
        past = self.streams.get(name)
        full = new if past is None else torch.cat([past, new.to(past.device)], dim=1)
        if not self.frozen:
            self.streams[name] = full
        return full

    def clone(self) -> HookedTransformerKeyValueCacheEntry:
        new = copy.copy(self)
        new._keys, new._values = self._keys.clone(), self._values.clone()
        new.streams = {name: t.clone() for name, t in self.streams.items()}
        return new


class HookedTransformerKeyValueCache:
    """Per-layer KV entries plus the attention mask of the cached positions.

    A state-space or hybrid model's recurrent layers hold a `RecurrentStateEntry` instead (their
    convolution window and state, `hooked/generation/recurrent_cache.py`); `cache[layer]` is either.

    A frozen cache is read but never extended: every forward attends to the cached
    prefix plus its own tokens, so one prefix can serve many continuations.
    """

    def __init__(
        self,
        entries: list[HookedTransformerKeyValueCacheEntry | RecurrentStateEntry],
        previous_attention_mask,
        frozen=False,
    ):
        self.entries = entries
        self.previous_attention_mask = previous_attention_mask
        self.frozen = frozen
        self.n_forwards = 0

    @classmethod
    def init_cache(cls, cfg, device=None, batch_size: int = 1, *, capacity: int = 0) -> HookedTransformerKeyValueCache:
        """An empty cache; `capacity` preallocates that many positions (it still grows past them).

        Attention layers get key/value entries of `cfg.kv_cache_entry_shape(layer)` (MLA: the latent and
        the shared rotary key); the other layers of a state-space or hybrid model (`cfg.layer_types`) get
        a `RecurrentStateEntry` (their convolution window and state).
        """
        device = cfg.device if device is None else device
        attention = set(cfg.attention_layers)

        def entry(layer: int) -> HookedTransformerKeyValueCacheEntry | RecurrentStateEntry:
            if layer not in attention:
                return RecurrentStateEntry()
            heads, d_key, d_value = cfg.kv_cache_entry_shape(layer)
            return HookedTransformerKeyValueCacheEntry(
                batch_size, heads, d_key, device, cfg.dtype, capacity=capacity, d_value=d_value
            )

        entries = [entry(layer) for layer in range(cfg.n_layers)]
        return cls(entries, torch.empty(batch_size, 0, dtype=torch.long, device=device))

    def __getitem__(self, layer: int) -> HookedTransformerKeyValueCacheEntry | RecurrentStateEntry:
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


# =========================================================================================
# A static cache: fixed capacity, fixed shapes, for compiled decode steps
# =========================================================================================
class StaticKeyValueCacheEntry:
    """One layer's keys and values in a `[batch, capacity, kv_head, d_head]` buffer that never moves.

    Unwritten columns hold zeros (never NaN: a masked key still multiplies its value by a
    zero weight). `update` writes the new positions at the state's `query_columns` and
    returns the whole buffer: attention reads every column and the mask hides the empty ones.
    """

    frozen = False

    def __init__(
        self,
        batch_size: int,
        capacity: int,
        n_heads: int,
        d_head: int,
        device=None,
        dtype=torch.float32,
        d_value: int | None = None,
        streams: dict[str, int] | None = None,
    ):
        self.keys = torch.zeros(batch_size, capacity, n_heads, d_head, device=device, dtype=dtype)
        self.values = torch.zeros(batch_size, capacity, n_heads, d_value or d_head, device=device, dtype=dtype)
        self.streams = {
            name: torch.zeros(batch_size, capacity, width, device=device, dtype=dtype)
            for name, width in (streams or {}).items()
        }  # name -> [batch, capacity, width]

    @property
    def past_keys(self) -> Float[torch.Tensor, "batch capacity kv_head d_head"]:
        return self.keys

    @property
    def past_values(self) -> Float[torch.Tensor, "batch capacity kv_head d_value"]:
        return self.values

    def update(
        self,
        keys: Float[torch.Tensor, "batch new kv_head d_head"],
        values: Float[torch.Tensor, "batch new kv_head d_value"],
        columns: Int[torch.Tensor, "new"] | None = None,
    ) -> tuple[
        Float[torch.Tensor, "batch capacity kv_head d_head"], Float[torch.Tensor, "batch capacity kv_head d_value"]
    ]:
        """Write the new keys and values at `columns`; the whole buffers, the new positions included."""
        if columns is None:
            raise ValueError("a static KV cache entry needs the columns to write (ForwardState.query_columns)")
        self.keys.index_copy_(1, columns, keys.to(self.keys.dtype))
        self.values.index_copy_(1, columns, values.to(self.values.dtype))
        return self.keys, self.values

    def append(
        self, name: str, new: Float[torch.Tensor, "batch new width"], columns: Int[torch.Tensor, "new"] | None = None
    ) -> Float[torch.Tensor, "batch capacity width"]:
        """Write stream `name`'s new positions at `columns`; the whole buffer."""
        if columns is None:
            raise ValueError("a static KV cache entry needs the columns to write (ForwardState.query_columns)")
        buffer = self.streams[name]
        buffer.index_copy_(1, columns, new.to(buffer.dtype))
        return buffer


def check_static_supported(cfg) -> None:
    """Refuse the static cache for models with recurrent layers (it holds keys and values only)."""
    if cfg.recurrent_layers:
        from hooked.core.errors import InputError

        kinds = sorted({cfg.mixer_types[layer] for layer in cfg.recurrent_layers})
        raise InputError(
            f"cache_implementation='static' does not support recurrent layers ({', '.join(kinds)} at layers "
            f"{cfg.recurrent_layers}): its fixed-shape buffers hold keys and values only. Use the default cache "
            "(cache_implementation=None), which carries each recurrent layer's convolution and state."
        )


class StaticKeyValueCache:
    """A KV cache of fixed `capacity` positions whose decode steps all have the same shapes.

    The first forward (the prefill) fills columns `[0, prompt)`; each later forward feeds one
    token, written at the next column. The column, the next position id, the mask of the
    filled columns and the step counter are device tensors advanced in place, so a decode
    step reads no Python number that changes: `torch.compile` traces it once, and on CUDA
    it can be captured as a CUDA graph. Attention runs over all `capacity` columns (empty
    ones masked), so attention scores and patterns seen by hooks are `[..., capacity]` wide.
    """

    frozen = False
    counts_own_forwards = True  # the forward does not touch n_forwards (it is read eagerly only)

    def __init__(self, cfg, batch_size: int, capacity: int, device=None):
        check_static_supported(cfg)
        device = torch.device(cfg.device if device is None else device)
        self.capacity = capacity
        shapes = [cfg.kv_cache_entry_shape(layer) for layer in range(cfg.n_layers)]  # (heads, d_key, d_value)
        self.entries = [
            StaticKeyValueCacheEntry(
                batch_size, capacity, heads, d_key, device, cfg.dtype, d_value=d_value, streams=cfg.kv_cache_streams
            )
            for heads, d_key, d_value in shapes
        ]
        self.mask = torch.zeros(batch_size, capacity, dtype=torch.long, device=device)  # [batch, capacity]
        self.column = torch.zeros(1, dtype=torch.long, device=device)  # [1]: the next column to write
        self.next_position = torch.zeros(batch_size, 1, dtype=torch.long, device=device)  # [batch, 1]
        self.step_index = torch.zeros((), dtype=torch.long, device=device)
        self.prefilled = False
        self.n_forwards = 0

    def __getitem__(self, layer: int) -> StaticKeyValueCacheEntry:
        return self.entries[layer]

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def previous_attention_mask(self) -> Int[torch.Tensor, "batch capacity"]:
        return self.mask

    def tensors(self) -> list[torch.Tensor]:
        """Every tensor a decode step mutates (to mark as static addresses for CUDA graphs)."""
        buffers = [t for e in self.entries for t in (e.keys, e.values, *e.streams.values())]
        return buffers + [self.mask, self.column, self.next_position, self.step_index]

    def forward_state(self, batch: int, n_new: int, attention_mask, causal: bool, step: int | None):
        """The `ForwardState` of the next forward: the prefill first, then one token per forward."""
        from hooked.components.forward_state import ForwardState
        from hooked.core.utils import positions_from_mask

        if batch != self.mask.shape[0]:
            raise ValueError(f"this static cache was built for batch size {self.mask.shape[0]}, the input has {batch}")
        if not self.prefilled:
            new = torch.ones(batch, n_new, dtype=torch.long, device=self.mask.device)
            new = new if attention_mask is None else attention_mask[:, -n_new:].to(new)  # [batch, n_new]
            if n_new > self.capacity:
                raise ValueError(
                    f"the prompt has {n_new} positions, more than the static cache's capacity {self.capacity}"
                )
            self.mask[:, :n_new] = new
            positions = positions_from_mask(new)  # [batch, n_new]
            columns = torch.arange(n_new, device=self.mask.device)  # [n_new]
            self.column.fill_(n_new)
            self.next_position.copy_(new.sum(-1, keepdim=True))
            self.prefilled = True
        elif n_new != 1:
            raise ValueError(f"a static KV cache takes one prefill, then one token per forward; got {n_new} tokens")
        else:
            columns = self.column.clone()  # [1]
            self.mask.index_fill_(1, columns, 1)
            positions = self.next_position.clone()  # [batch, 1]
            self.column.add_(1)
            self.next_position.add_(1)
        step_index = self.step_index.clone()
        self.step_index.add_(1)
        if step is None and not torch.compiler.is_compiling():  # a Python int would be baked into a graph
            step = self.n_forwards
        if not torch.compiler.is_compiling():
            self.n_forwards += 1
        return ForwardState(
            self.mask, positions, n_new, self.capacity, causal, step, self,
            query_columns=columns, step_index=step_index,
        )  # fmt: skip
