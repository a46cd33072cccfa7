"""Attention patterns of one layer's heads, with the tokens as labels; hover a token to follow it."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from jaxtyping import Int

from hooked.core.errors import InputError
from hooked.viz._common import floats, one_sequence, str_tokens_for, window
from hooked.viz._html import View

MAX_POS = 64
MAX_HEADS = 16


def attention_patterns(
    model_or_str_tokens,
    cache,
    layer: int,
    heads: Sequence[int] | None = None,
    *,
    tokens: str | Int[torch.Tensor, "... pos"] | None = None,
    max_pos: int = MAX_POS,
    max_heads: int = MAX_HEADS,
    batch_index: int = 0,
) -> View:
    """One `[query, key]` grid per head of `layer` (`cache["pattern", layer]`).

    The first argument is the model (with `tokens=` the prompt or its ids, for labels) or
    the position labels themselves. Long prompts keep the last `max_pos` positions and
    many heads the first `max_heads`; the page says what was left out.

    Args:
        model_or_str_tokens: the model, or the position labels (one string per position).
        cache: the `ActivationCache` of `model.run_with_cache(...)` holding `pattern` of `layer`.
        layer: the layer whose heads are drawn.
        heads: the heads to draw (None: all, up to `max_heads`).
        tokens: the prompt or its ids `[pos]`, for labels (default: the cache's tokens).
        max_pos: keep at most this many positions (the last ones).
        max_heads: draw at most this many heads (the first ones).
        batch_index: which prompt of the batch.

    Returns:
        A `View`: renders in Jupyter, `.save(path)` writes one HTML file, `+` combines views.
    """
    cache = one_sequence(cache, batch_index)
    n_layers = cache.model.cfg.n_layers
    if not -n_layers <= layer < n_layers:
        raise InputError(f"layer={layer} is outside the model's layers [0, {n_layers})")
    layer = layer % n_layers
    pattern = cache["pattern", layer]  # [head, query, key]
    n_heads = pattern.shape[0]
    heads = list(range(n_heads)) if heads is None else [int(h) for h in heads]
    bad = [h for h in heads if not 0 <= h < n_heads]
    if bad:
        raise InputError(f"heads {bad} are outside the layer's heads [0, {n_heads})")
    labels = str_tokens_for(model_or_str_tokens, cache, tokens)
    notes = []
    if len(heads) > max_heads:
        notes.append(f"showing {max_heads} of {len(heads)} heads; pass heads=[...] or raise max_heads to see others")
        heads = heads[:max_heads]
    keep, note = window(len(labels), max_pos)
    if note:
        notes.append(note + " (attention to earlier positions is not drawn)")
    data = {
        "kind": "attention",
        "title": f"Attention patterns, layer {layer}",
        "description": "One grid per head: row = the query token (the one attending), column = the key token (the "
        "one attended to); the darker the cell, the more weight. Each row sums to 1. Hover a token to frame its row "
        "and column in every head.",
        "layer": layer,
        "heads": [f"L{layer}H{h}" for h in heads],
        "head_indices": heads,
        "positions": list(range(keep.start, keep.stop)),
        "tokens": labels[keep],
        "patterns": floats(pattern[heads][:, keep, keep]),  # [head, query, key]
        "notes": notes,
    }
    return View([data], data["title"])
