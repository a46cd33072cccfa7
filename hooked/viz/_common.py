"""Helpers shared by the views: the cache's one sequence, token labels, caps on large inputs."""

from __future__ import annotations

import math
from typing import Any

import torch

from hooked.core.errors import InputError


def one_sequence(cache, batch_index: int = 0):
    """The cache with its batch axis removed (`batch_index` picks the sequence of a batched cache)."""
    if not cache.has_batch_dim:
        return cache
    n = cache._batch_size()
    if not -n <= batch_index < n:
        raise InputError(f"batch_index={batch_index} is outside the cache's batch of {n} sequences")
    return cache.apply_slice_to_batch_dim(batch_index)


def seq_len(cache) -> int:
    """Positions in a batch-free cache, read off the residual stream."""
    return cache["resid_pre", 0].shape[-2]


def str_tokens_for(model_or_tokens, cache, tokens=None) -> list[str]:
    """Labels for the positions: given strings, or the model's decoding of `tokens` (default: the cache's),
    or `pos i`."""
    if tokens is None:
        tokens = getattr(cache, "tokens", None)
    model: Any = model_or_tokens  # (a model with a tokenizer, in the branches that decode)
    if isinstance(model_or_tokens, (list, tuple)) and all(isinstance(t, str) for t in model_or_tokens):
        labels = list(model_or_tokens)
    elif isinstance(tokens, str) and getattr(model, "tokenizer", None) is not None:
        labels = model.to_str_tokens(tokens)
    elif tokens is not None and getattr(model, "tokenizer", None) is not None:
        labels = model.to_str_tokens(torch.as_tensor(tokens).reshape(-1))
    else:
        labels = [f"pos {i}" for i in range(seq_len(cache))]
    if len(labels) != seq_len(cache):
        raise InputError(f"{len(labels)} token labels for a cache of {seq_len(cache)} positions: pass one per position")
    return labels


def window(n: int, max_pos: int) -> tuple[slice, str | None]:
    """The last `max_pos` of `n` positions, and the note that says so when some are left out."""
    if max_pos < 1:
        raise InputError(f"max_pos must be >= 1, got {max_pos}")
    if n <= max_pos:
        return slice(0, n), None
    start = n - max_pos
    return slice(start, n), f"showing the last {max_pos} of {n} positions ({start}..{n - 1}); raise max_pos to see more"


def floats(t: torch.Tensor, digits: int | None = None) -> list | float | None:
    """A tensor as nested Python floats for JSON (non-finite values become None; a 0-d tensor gives one value)."""

    def clean(x: float):
        if not math.isfinite(x):
            return None
        return round(x, digits) if digits is not None else x

    values = t.detach().float().cpu().tolist()

    def walk(v):
        return [walk(x) for x in v] if isinstance(v, list) else clean(v)

    return walk(values)
