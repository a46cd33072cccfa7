"""Activations over text: a strip of tokens coloured by one value per position."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from jaxtyping import Float

from hooked.core.errors import InputError
from hooked.viz._common import floats, window
from hooked.viz._html import View

MAX_POS = 1024


def activations_over_text(
    str_tokens: Sequence[str],
    values: Float[torch.Tensor, "pos"] | Sequence[float],
    *,
    title: str = "Activations over text",
    max_pos: int = MAX_POS,
    vmax: float | None = None,
) -> View:
    """Colour each token by its value (blue positive, red negative); hovering a token shows the exact value.

    Full colour is at `±vmax` (larger values are clamped), shown in a legend above the strip. Without `vmax`,
    strips put on one page with `a + b` share one scale, the largest |value| among them, so equal colours mean
    equal values across strips. Whitespace-only tokens are drawn as `␣`.

    Args:
        str_tokens: the tokens as strings, e.g. `model.to_str_tokens(prompt)`.
        values: one value per token `[pos]`, e.g. a neuron's `cache["post", layer][0, :, neuron]`.
        title: the heading above the strip.
        max_pos: keep at most this many positions (the last ones).
        vmax: the value drawn in full colour (None: shared across the page's strips).

    Returns:
        A `View` of the coloured tokens.
    """
    if vmax is not None and not (isinstance(vmax, (int, float)) and math.isfinite(vmax) and vmax > 0):
        raise InputError(f"vmax={vmax!r} must be a positive number (the value drawn in full colour), or None")
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
        "vmax": None if vmax is None else float(vmax),
        "abs_max": _abs_max(values[keep]),
        "scale_group": "text",
        "notes": [note] if note else [],
    }
    return View([data], title)


def _abs_max(values: torch.Tensor) -> float:
    """The largest finite |value| (0.0 when there is none)."""
    finite = values.float()[torch.isfinite(values.float())].abs()
    return float(finite.max()) if finite.numel() else 0.0
