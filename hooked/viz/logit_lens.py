"""The logit lens as a layers x positions heatmap of one target token's probability (or rank)."""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn as nn
from jaxtyping import Float, Int

from hooked.core.errors import InputError
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


def _unembed(model, resid: Float[torch.Tensor, "pos d_model"]) -> Float[torch.Tensor, "pos d_vocab"]:
    """One layer's lens logits, as `cache.logit_lens()` makes them: `ln_final` on this stream, then `unembed`."""
    norm = getattr(model, "ln_final", nn.Identity())
    return model.unembed(norm(resid[None]))[0].float()  # [pos, d_vocab]


def _lens_row(logits: Float[torch.Tensor, "pos d_vocab"], ids: Int[torch.Tensor, "pos"], mode: str):
    """The target's probability (or rank) at each position, and the top token with its probability."""
    target_logit = logits.gather(-1, ids[:, None])  # [pos, 1]
    probs = logits.softmax(-1)  # [pos, d_vocab]
    value = probs.gather(-1, ids[:, None])[:, 0] if mode == "prob" else (logits > target_logit).sum(-1)
    top_p, top_id = probs.max(-1)  # [pos]
    return value, top_p, top_id


def _decoder(model, ids: torch.Tensor):
    """id -> string for every id in `ids`, decoded once each (`#id` without a tokenizer)."""
    unique = ids.unique().tolist()
    if getattr(model, "tokenizer", None) is None:
        return lambda i: f"#{int(i)}"
    table = dict(zip(unique, model.to_str_tokens(torch.tensor(unique)), strict=True))
    return lambda i: table[int(i)]


def _layer_help(label: str) -> str:
    """What a row of `accumulated_resid` is, in words (`3_pre`, `3_mid`, `final_post`)."""
    if label == "final_post":
        return "the residual stream after the last layer: the model's output"
    layer, where = label.split("_")
    return (
        f"the residual stream entering layer {layer}"
        if where == "pre"
        else f"after layer {layer}'s attention, before its MLP"
    )


def _description(mode: str, default_target: bool) -> str:
    cell = "the target's probability, in %" if mode == "prob" else "the target's rank among all tokens (0 = top)"
    target = "the token the model finally predicts next there" if default_target else "the token asked for"
    return (
        "Each row reads the residual stream at one depth as if it were the last layer (through ln_final and the "
        "unembedding): l_pre is the stream entering layer l, final_post the stream after the last layer (the "
        f"model's output). Each column is a position: its input token, then its target ({target}). A cell is "
        f"{cell} at that depth; hover a cell for the top token at that depth."
    )


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

    Like `cache.logit_lens()` (each layer through `ln_final`, then `W_U`), one layer at a time
    so that a long prompt never holds every layer's full-vocabulary logits at once. A cell holds the
    probability (`mode="prob"`) or rank (0 = top, `mode="rank"`) of `target` (default: the
    model's final prediction at that position); hovering shows that layer's top token.

    Args:
        model: the model the cache came from.
        cache: its `ActivationCache`, holding every `resid_pre` and the last `resid_post`.
        target: the token to follow: a string (one token), an id, or ids `[pos]` (one per position).
        mode: "prob" (its probability) or "rank" (0 = the top token).
        tokens: the prompt or its ids `[pos]`, for labels (default: the cache's tokens).
        max_pos: keep at most this many positions (the last ones).
        batch_index: which prompt of the batch.

    Returns:
        A layers x positions heatmap `View`.
    """
    if mode not in ("prob", "rank"):
        raise InputError(f"mode={mode!r}: use 'prob' or 'rank'")
    cache = one_sequence(cache, batch_index)
    labels = str_tokens_for(model, cache, tokens)
    keep, note = window(len(labels), max_pos)
    stack, layers = cache.accumulated_resid(pos_slice=keep, return_labels=True)  # [layer, pos, d_model]
    ids = _targets(model, cache, target, keep)
    if ids.numel() == 0:
        ids = _unembed(model, stack[-1]).argmax(-1)  # [pos]: the model's own prediction
    ids = ids.to(stack.device)
    n_out = model.cfg.d_vocab_out
    if int(ids.min()) < 0 or int(ids.max()) >= n_out:
        raise InputError(f"target id {int(ids.max() if ids.max() >= n_out else ids.min())} is outside [0, {n_out})")
    rows = [_lens_row(_unembed(model, resid), ids, mode) for resid in stack]  # one layer at a time: [pos, d_vocab]
    values, top_p, top_id = (torch.stack(r) for r in zip(*rows, strict=True))  # [layer, pos] each
    decode = _decoder(model, torch.cat([ids, top_id.reshape(-1)]))
    data = {
        "kind": "logit_lens",
        "title": f"Logit lens: {'probability' if mode == 'prob' else 'rank'} of "
        + (f"{decode(ids[0])!r}" if target is not None and ids.unique().numel() == 1 else "each position's target")
        + (" (the model's final prediction there)" if target is None else ""),
        "mode": mode,
        "description": _description(mode, target is None),
        "layers": layers,
        "layer_help": [_layer_help(label) for label in layers],
        "positions": list(range(keep.start, keep.stop)),
        "tokens": labels[keep],
        "target_ids": [int(i) for i in ids],
        "targets": [decode(i) for i in ids],
        "values": floats(values) if mode == "prob" else values.tolist(),
        "top_tokens": [[decode(i) for i in row] for row in top_id],
        "top_ids": top_id.tolist(),
        "top_probs": floats(top_p),
        "d_vocab": n_out,
        "notes": [note] if note else [],
    }
    return View([data], data["title"])
