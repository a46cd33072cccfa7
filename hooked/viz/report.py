"""All the views for one prompt on one page: what `hooked inspect "..." --html report.html` writes."""

from __future__ import annotations

import torch

from hooked.analysis.inspection import top_heads
from hooked.core.errors import InputError
from hooked.viz._html import View
from hooked.viz.attention import attention_patterns
from hooked.viz.attribution import _label, _token_id, direct_logit_attribution
from hooked.viz.logit_lens import logit_lens
from hooked.viz.text import activations_over_text


@torch.inference_mode()
def prompt_views(
    model, prompt: str, layer: int | None = None, answer: str | int | None = None, wrong: str | int | None = None
) -> View:
    """Logit lens, attention of one layer, direct logit attribution (per head and per layer) and
    each token's log-probability, for `prompt`'s final prediction.

    `layer` defaults to the layer of the head attending most sharply from the last position
    (the page says so). The attribution is for the logit of `answer` (default: the model's
    top prediction), minus the logit of `wrong` when given: a logit difference, which
    cancels what pushes both tokens alike.
    """
    tokens = model.to_tokens(prompt, truncate=False)
    if tokens.shape[1] > model.cfg.n_ctx:
        raise InputError(
            f"the prompt is {tokens.shape[1]} tokens, longer than the model's context of {model.cfg.n_ctx}: shorten it"
        )
    logits, cache = model.run_with_cache(tokens)
    str_tokens = model.to_str_tokens(tokens[0])
    answer_id = int(logits[0, -1].argmax()) if answer is None else _token_id(model, answer)
    wrong_id = None if wrong is None else _token_id(model, wrong)
    if wrong_id is not None and wrong_id == answer_id:
        raise InputError(f"answer and wrong are the same token ({_label(model, answer_id)}): pick two different ones")
    shown = _check_layer(model, layer) if layer is not None else _sharpest(model, cache, str_tokens)
    attention = attention_patterns(model, cache, shown)
    why = _why_layer(model, cache, str_tokens, layer, shown)
    attention.data["description"] = f"{why} {attention.data['description']}"
    log_probs = logits[0, :-1].float().log_softmax(-1).gather(-1, tokens[0, 1:, None])[:, 0]  # [pos-1]
    surprise = torch.cat([log_probs.new_full((1,), float("nan")), log_probs])  # [pos]: none for the first token
    view = (
        logit_lens(model, cache)
        + attention
        + direct_logit_attribution(model, cache, answer_id, wrong_id, per="head")
        + direct_logit_attribution(model, cache, answer_id, wrong_id, per="layer")
        + activations_over_text(str_tokens, surprise, title="Log-probability of each token given the ones before")
    )
    view.title = f"hooked: {prompt}"
    return view


def _check_layer(model, layer: int) -> int:
    n = model.cfg.n_layers
    if not -n <= layer < n:
        raise InputError(f"layer={layer} is outside the model's layers [0, {n})")
    return layer % n


def _sharpest(model, cache, str_tokens: list[str]) -> int:
    """The layer of the head whose attention from the last position is most concentrated on one token."""
    return int(top_heads(model, cache, -1, str_tokens, k=1)[0][0][1:].split("H")[0])


def _why_layer(model, cache, str_tokens: list[str], asked: int | None, layer: int) -> str:
    if asked is not None:
        return f"Layer {layer}, as asked."
    head, weight, token = top_heads(model, cache, -1, str_tokens, k=1)[0]
    return (
        f"Layer {layer} is shown because its head {head} attends most sharply from the last token "
        f"({str_tokens[-1]!r}): {weight:.0%} of its attention on {token!r} (the first token not counted). "
        "Pass --layer (prompt_views(layer=...)) for another."
    )
