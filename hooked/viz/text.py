"""Activations over text: a strip of tokens coloured by one value per position."""

from __future__ import annotations

from typing import Sequence

import torch
from jaxtyping import Float

from hooked.errors import InputError
from hooked.viz._common import floats, window
from hooked.viz._html import View

MAX_POS = 1024


def activations_over_text(
    str_tokens: Sequence[str],
    values: Float[torch.Tensor, "pos"] | Sequence[float],
    *,
    title: str = "Activations over text",
    max_pos: int = MAX_POS,
) -> View:
    """Colour each token by its value (blue positive, red negative); hovering a token shows the exact value.

    Args:
        str_tokens: the tokens as strings, e.g. `model.to_str_tokens(prompt)`.
        values: one value per token `[pos]`, e.g. a neuron's `cache["post", layer][0, :, neuron]`.
        title: the heading above the strip.
        max_pos: keep at most this many positions (the last ones).

    Returns:
        A `View` of the coloured tokens.
    """
    values = torch.as_tensor(values).detach()
    if values.ndim != 1:
        raise InputError(f"values must be one number per position ([pos]), got shape {tuple(values.shape)}")
    if len(str_tokens) != values.shape[0]:
        raise InputError(f"{len(str_tokens)} tokens but {values.shape[0]} values: pass one value per token")
    keep, note = window(len(str_tokens), max_pos)
    data = {
        "kind": "text",
        "title": title,
        "positions": list(range(keep.start, keep.stop)),
        "tokens": [str(t) for t in list(str_tokens)[keep]],
        "values": floats(values[keep]),
        "notes": [note] if note else [],
    }
    return View([data], title)
