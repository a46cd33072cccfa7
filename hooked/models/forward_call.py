"""`ForwardCall`: the options of one `HookedTransformer.forward` call, checked once.

`forward` is a template: it checks its arguments into a `ForwardCall`, enters the blocks
(`_enter_blocks`: embed the input, or take a residual at `start_at_layer`), then runs them
(`_run_blocks`: blocks `start`..`stop` and, when the call runs to the end, the head). A model
that runs its blocks elsewhere (a pipeline over processes) replaces those two steps and
reads the same `ForwardCall`, so the argument checks and the head are written once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hooked.core.validation import check_layer

RETURN_TYPES = ("logits", "loss", "both", None)


@dataclass(frozen=True)
class ForwardCall:
    """What one forward call asks for, besides its input.

    Attributes:
        return_type: "logits", "loss", "both" or None (run for the hooks only).
        loss_per_token: the loss per position `[batch, pos - 1]` instead of its mean.
        prepend_bos, padding_side: how text input is tokenized (the model's defaults when
            left at `USE_DEFAULT_VALUE`).
        start: the first block to run (None: embed the input and run from block 0); never negative.
        stop: run up to this block and return the residual entering it (None: run to the end).
        past_kv_cache: the KV cache to read and extend, if any.
        step: the generation step hooks read from `forward_state.step` (None: the cache's count).
        logits_to_keep: unembed only the last k positions (0: all).
    """

    return_type: str | None
    loss_per_token: bool
    prepend_bos: Any
    padding_side: Any
    start: int | None
    stop: int | None
    past_kv_cache: Any
    step: int | None
    logits_to_keep: int

    @classmethod
    def checked(cls, n_layers: int, *, start_at_layer: int | None, stop_at_layer: int | None, **options):
        """A `ForwardCall` from `forward`'s keywords; negative layers count from the end, as in a slice."""
        if options["return_type"] not in RETURN_TYPES:
            raise ValueError(f"return_type must be 'logits', 'loss', 'both' or None, got {options['return_type']!r}")
        if options["logits_to_keep"] and options["return_type"] in ("loss", "both"):
            raise ValueError("logits_to_keep is for return_type='logits': a loss needs the logits of every position")
        start, stop = (
            _layer(n_layers, v, n) for v, n in ((start_at_layer, "start_at_layer"), (stop_at_layer, "stop_at_layer"))
        )
        return cls(start=start, stop=stop, **options)


def _layer(n_layers: int, layer: int | None, name: str) -> int | None:
    if layer is None:
        return None
    check_layer(layer, name, -n_layers, n_layers)
    return layer + n_layers if layer < 0 else layer
