"""Direct logit attribution as sorted bars: what each head (or layer) writes towards an answer."""

from __future__ import annotations

from typing import Literal

import torch

from hooked.core.errors import InputError
from hooked.viz._common import floats, one_sequence
from hooked.viz._html import View

MAX_BARS = 40


def _token_id(model, token) -> int:
    return model.to_single_token(token) if isinstance(token, str) else int(token)


def _label(model, token_id: int) -> str:
    return (
        repr(model.to_single_str_token(token_id)) if getattr(model, "tokenizer", None) is not None else f"#{token_id}"
    )


@torch.inference_mode()
def direct_logit_attribution(
    model,
    cache,
    answer: str | int,
    wrong: str | int | None = None,
    per: Literal["head", "layer"] = "head",
    *,
    pos: int = -1,
    max_bars: int = MAX_BARS,
    batch_index: int = 0,
) -> View:
    """Each component's direct contribution to the logit of `answer` (minus `wrong`'s) at `pos`.

    `per="head"` uses `cache.stack_head_results()` (one bar per `L{l}H{h}`), `per="layer"`
    `cache.decompose_resid()` (embeddings, then each layer's attention and MLP output);
    both go through `cache.logit_attrs()`, the final norm's cached scale times `W_U`.
    With more than `max_bars` components the largest ones by magnitude are shown.

    Args:
        model: the model the cache came from.
        cache: its `ActivationCache` (with the hooks `stack_head_results` / `decompose_resid` need).
        answer: the token whose logit is attributed: a string (one token) or an id.
        wrong: a token whose logit is subtracted (the logit difference), or None.
        per: "head" (one bar per head) or "layer" (embeddings, attention and MLP outputs).
        pos: the position whose prediction is attributed.
        max_bars: the most bars drawn.
        batch_index: which prompt of the batch.

    Returns:
        A sorted bar chart `View`.
    """
    if per not in ("head", "layer"):
        raise InputError(f"per={per!r}: use 'head' or 'layer'")
    if max_bars < 1:
        raise InputError(f"max_bars must be >= 1, got {max_bars}")
    cache = one_sequence(cache, batch_index)
    n = cache["resid_pre", 0].shape[-2]
    if not -n <= pos < n:
        raise InputError(f"pos={pos} is outside the cache's {n} positions")
    if per == "head":
        stack, labels = cache.stack_head_results(-1, return_labels=True, pos_slice=pos)  # [component, d_model]
    else:
        stack, labels = cache.decompose_resid(-1, return_labels=True, pos_slice=pos)  # [component, d_model]
    answer_id = _token_id(model, answer)
    wrong_id = None if wrong is None else _token_id(model, wrong)
    attrs = cache.logit_attrs(stack, answer_id, wrong_id, pos_slice=pos, has_batch_dim=False).float()  # [component]
    order = attrs.abs().argsort(descending=True)
    notes = []
    if len(order) > max_bars:
        notes.append(
            f"showing the {max_bars} largest of {len(order)} components by magnitude; raise max_bars to see all"
        )
        order = order[:max_bars]
    order = order[attrs[order].argsort(descending=True)]
    what = f"logit of {_label(model, answer_id)}" + ("" if wrong_id is None else f" minus {_label(model, wrong_id)}")
    parts = "attention head" if per == "head" else "layer part (embeddings, each attention and MLP output)"
    data = {
        "kind": "bars",
        "title": f"Direct logit attribution per {per}: {what} at position {pos % n}",
        "description": f"Each bar is what one {parts} writes into the residual stream at position {pos % n}, read "
        f"directly by the unembedding through the final norm's cached scale: its share of the {what}. Blue pushes "
        "towards the answer, red away; later layers can still change what earlier ones wrote.",
        "per": per,
        "pos": pos % n,
        "answer_id": answer_id,
        "wrong_id": wrong_id,
        "labels": [labels[int(i)] for i in order],
        "values": floats(attrs[order]),
        "total": float(attrs.sum()),
        "notes": notes,
    }
    return View([data], data["title"])
