"""All the views for one prompt on one page: what `hooked inspect "..." --html report.html` writes."""

from __future__ import annotations

import torch

from hooked.errors import InputError
from hooked.inspection import top_heads
from hooked.viz._html import View
from hooked.viz.attention import attention_patterns
from hooked.viz.attribution import direct_logit_attribution
from hooked.viz.logit_lens import logit_lens
from hooked.viz.text import activations_over_text


@torch.inference_mode()
def prompt_views(model, prompt: str, layer: int | None = None) -> View:
    """Logit lens, attention of one layer, direct logit attribution (per head and per layer) and
    each token's log-probability, for `prompt`'s final prediction.

    `layer` defaults to the layer of the head attending most sharply from the last position.
    """
    tokens = model.to_tokens(prompt, truncate=False)
    if tokens.shape[1] > model.cfg.n_ctx:
        raise InputError(
            f"the prompt is {tokens.shape[1]} tokens, longer than the model's context of {model.cfg.n_ctx}: shorten it"
        )
    logits, cache = model.run_with_cache(tokens)
    str_tokens = model.to_str_tokens(tokens[0])
    answer = int(logits[0, -1].argmax())
    if layer is None:
        layer = int(top_heads(model, cache, -1, str_tokens, k=1)[0][0][1:].split("H")[0])
    log_probs = logits[0, :-1].float().log_softmax(-1).gather(-1, tokens[0, 1:, None])[:, 0]  # [pos-1]
    surprise = torch.cat([log_probs.new_full((1,), float("nan")), log_probs])  # [pos]: none for the first token
    view = (
        logit_lens(model, cache)
        + attention_patterns(model, cache, layer)
        + direct_logit_attribution(model, cache, answer, per="head")
        + direct_logit_attribution(model, cache, answer, per="layer")
        + activations_over_text(str_tokens, surprise, title="Log-probability of each token given the ones before")
    )
    view.title = f"hooked: {prompt}"
    return view
