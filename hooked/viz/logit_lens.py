"""The logit lens as a layers x positions heatmap of one target token's probability (or rank)."""

from __future__ import annotations

from typing import Literal

import torch
from jaxtyping import Int

from hooked.errors import InputError
from hooked.viz._common import floats, one_sequence, str_tokens_for, window
from hooked.viz._html import View

MAX_POS = 256


def _targets(model, cache, target, keep: slice) -> torch.Tensor:
    """One target id per shown position: a token (str or id) everywhere, a `[pos]` tensor, or, by default,
    the model's final prediction at each position."""
    n = keep.stop - keep.start
    if target is None:
        return cache["resid_post", -1].new_zeros(0)  # filled from the final layer's argmax by the caller
    if isinstance(target, str):
        target = model.to_single_token(target)
    ids = torch.as_tensor(target).reshape(-1)
    if ids.numel() == 1:
        return ids.repeat(n)
    if ids.numel() != cache["resid_pre", 0].shape[-2]:
        raise InputError(f"target has {ids.numel()} ids; pass one token, or one id per position of the cache")
    return ids[keep]


def _decoder(model, ids: torch.Tensor):
    """id -> string for every id in `ids`, decoded once each (`#id` without a tokenizer)."""
    unique = ids.unique().tolist()
    if getattr(model, "tokenizer", None) is None:
        return lambda i: f"#{int(i)}"
    table = dict(zip(unique, model.to_str_tokens(torch.tensor(unique))))
    return lambda i: table[int(i)]


@torch.inference_mode()
def logit_lens(
    model,
    cache,
    target: str | int | Int[torch.Tensor, "pos"] | None = None,
    mode: Literal["prob", "rank"] = "prob",
    *,
    tokens: str | Int[torch.Tensor, "... pos"] | None = None,
    max_pos: int = MAX_POS,
    batch_index: int = 0,
) -> View:
    """Unembed the residual stream before each layer (and the final one) at every position.

    Uses `cache.logit_lens()` (each layer through `ln_final`, then `W_U`). A cell holds the
    probability (`mode="prob"`) or rank (0 = top, `mode="rank"`) of `target` (default: the
    model's final prediction at that position); hovering shows that layer's top token.
    """
    if mode not in ("prob", "rank"):
        raise InputError(f"mode={mode!r}: use 'prob' or 'rank'")
    cache = one_sequence(cache, batch_index)
    labels = str_tokens_for(model, cache, tokens)
    keep, note = window(len(labels), max_pos)
    logits, layers = cache.logit_lens(pos_slice=keep, return_labels=True)  # [layer, pos, d_vocab]
    logits = logits.float()
    ids = _targets(model, cache, target, keep)
    if ids.numel() == 0:
        ids = logits[-1].argmax(-1)  # [pos]
    ids = ids.to(logits.device)
    check = max(model.cfg.d_vocab_out, 1)
    if int(ids.min()) < 0 or int(ids.max()) >= check:
        raise InputError(f"target id {int(ids.max() if ids.max() >= check else ids.min())} is outside [0, {check})")
    probs = logits.softmax(-1)  # [layer, pos, d_vocab]
    index = ids[None, :, None].expand(len(layers), -1, 1)  # [layer, pos, 1]
    target_logit = logits.gather(-1, index)  # [layer, pos, 1]
    values = probs.gather(-1, index)[..., 0] if mode == "prob" else (logits > target_logit).sum(-1)  # [layer, pos]
    top_p, top_id = probs.max(-1)  # [layer, pos]
    decode = _decoder(model, torch.cat([ids, top_id.reshape(-1)]))
    data = {
        "kind": "logit_lens",
        "title": f"Logit lens: {'probability' if mode == 'prob' else 'rank'} of "
        + (f"{decode(ids[0])!r}" if target is not None and ids.unique().numel() == 1 else "each position's target")
        + (" (the model's final prediction there)" if target is None else ""),
        "mode": mode,
        "layers": layers,
        "positions": list(range(keep.start, keep.stop)),
        "tokens": labels[keep],
        "target_ids": [int(i) for i in ids],
        "targets": [decode(i) for i in ids],
        "values": floats(values) if mode == "prob" else values.tolist(),
        "top_tokens": [[decode(i) for i in row] for row in top_id],
        "top_ids": top_id.tolist(),
        "top_probs": floats(top_p),
        "d_vocab": int(logits.shape[-1]),
        "notes": [note] if note else [],
    }
    return View([data], data["title"])
