"""A readable one-prompt report: predictions, logit lens, attention and direct logit attribution.

This is what `hooked inspect "prompt"` prints. Each section is a small function over a
model and its activation cache, so notebooks can reuse them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from jaxtyping import Float

from hooked.core.errors import InputError


@dataclass
class Report:
    prompt: str
    str_tokens: list[str]
    top_tokens: list[tuple[str, float]]
    logit_lens: list[tuple[str, int, float]]  # (layer label, rank of the final prediction, its probability)
    top_heads: list[tuple[str, float, str]]  # (head label, weight, attended token)
    attributions: list[tuple[str, float]]  # (component label, direct logit contribution)
    answer: str = ""  # the token whose logit is attributed (default: the top prediction)
    wrong: str | None = None  # minus this token's logit, when given


def final_norm(model, resid: Float[torch.Tensor, "... d_model"]) -> Float[torch.Tensor, "... d_model"]:
    """`ln_final` with statistics recomputed on `resid` (the logit-lens convention).

    AltUp streams (Gemma 3n, `[batch, pos, stream, d_model]`) are first collapsed as the model collapses
    its last ones.
    """
    if model.cfg.uses_altup:
        resid = model.altup_streams.collapse(resid)
    if model.cfg.normalization_type is None:
        return resid
    return model.ln_final(resid)


def logit_lens(model, cache, pos: int, target: int) -> list[tuple[str, int, float]]:
    """Rank and probability of `target` when each layer's residual stream is unembedded."""
    rows = []
    names = [(f"resid_pre {layer_i}", cache["resid_pre", layer_i]) for layer_i in range(model.cfg.n_layers)]
    names.append(("final resid", cache["resid_post", model.cfg.n_layers - 1]))
    for label, resid in names:
        logits = model.unembed(final_norm(model, resid[:, pos : pos + 1 or None]))[0, 0]  # [d_vocab]
        probs = logits.float().softmax(-1)
        rank = int((logits > logits[target]).sum())
        rows.append((label, rank, float(probs[target])))
    return rows


def top_heads(
    model, cache, pos: int, str_tokens: list[str], k: int = 5, skip_first: bool = True
) -> list[tuple[str, float, str]]:
    """The k (layer, head) pairs whose attention from `pos` is most concentrated on one token.

    With `skip_first`, attention to the first token (usually BOS, where heads with
    nothing to do park their attention) does not count.
    """
    layers = model.cfg.attention_layers  # a hybrid's recurrent layers have no heads
    if not layers:
        return []
    weights = torch.stack([cache["pattern", layer_i][0, :, pos] for layer_i in layers])  # [layer, head, key]
    if skip_first and weights.shape[-1] > 1:
        weights = weights.clone()
        weights[..., 0] = 0
    best, where = weights.max(-1)  # [layer, head]
    order = best.flatten().argsort(descending=True)[:k]
    H = model.cfg.n_heads
    return [
        (f"L{layers[int(i) // H]}H{int(i) % H}", float(best.flatten()[i]), str_tokens[int(where.flatten()[i])])
        for i in order
    ]


def direct_logit_attribution(
    model, cache, pos: int, target: int, k: int = 8, wrong: int | None = None
) -> list[tuple[str, float]]:
    """Each component's output at `pos`, through the final norm's cached scale, dotted with W_U[:, target]
    (minus W_U[:, wrong]: the logit difference)."""
    parts = [("embed", cache["hook_embed"][0, pos])]
    if "hook_pos_embed" in cache:
        parts.append(("pos_embed", cache["hook_pos_embed"][0, pos]))
    labels = {"attn_out": "attn", "mixer_out": "mixer", "mlp_out": "mlp"}
    for layer in range(model.cfg.n_layers):
        for write in model.cfg.block_writes(layer):  # attention, a recurrent mixer, an MLP
            parts.append((f"{labels[write]} {layer}", cache[write, layer][0, pos]))
    stack = torch.stack([p for _, p in parts])  # [component, d_model]
    if model.cfg.uses_layer_norm:
        stack = stack - stack.mean(-1, keepdim=True)
    if model.cfg.normalization_type is not None:
        stack = stack / cache["ln_final.hook_scale"][0, pos]
        if hasattr(model.ln_final, "w"):
            stack = stack * model.ln_final.w
    direction = model.W_U[:, target] if wrong is None else model.W_U[:, target] - model.W_U[:, wrong]  # [d_model]
    contributions = stack @ direction  # [component]
    order = contributions.abs().argsort(descending=True)[:k]
    return [(parts[int(i)][0], float(contributions[i])) for i in order]


@torch.inference_mode()
def inspect_prompt(model, prompt: str, top_k: int = 10, answer: str | None = None, wrong: str | None = None) -> Report:
    """Run `prompt` once with a full cache and assemble the report for its last position.

    The logit lens and the attribution follow `answer` (default: the top prediction); with
    `wrong` the attribution is of the logit difference `answer - wrong`. A prompt longer
    than the model's context raises `InputError` (it is never truncated).
    """
    tokens = model.to_tokens(prompt, truncate=False)
    if tokens.shape[1] > model.cfg.n_ctx:
        raise InputError(
            f"the prompt is {tokens.shape[1]} tokens, longer than the model's context of {model.cfg.n_ctx}: shorten it"
        )
    top_k = min(top_k, model.cfg.d_vocab_out)
    logits, cache = model.run_with_cache(tokens)
    str_tokens = model.to_str_tokens(prompt)
    probs = logits[0, -1].float().softmax(-1)
    top = probs.topk(top_k)
    target = int(top.indices[0]) if answer is None else model.to_single_token(answer)
    wrong_id = None if wrong is None else model.to_single_token(wrong)
    return Report(
        prompt=prompt,
        str_tokens=str_tokens,
        top_tokens=[
            (model.to_single_str_token(int(i)), float(p)) for p, i in zip(top.values, top.indices, strict=True)
        ],
        logit_lens=logit_lens(model, cache, -1, target),
        top_heads=top_heads(model, cache, -1, str_tokens),
        # AltUp's last streams are projected and averaged: the logits are no sum of the components' outputs
        attributions=[] if model.cfg.uses_altup else direct_logit_attribution(model, cache, -1, target, wrong=wrong_id),
        answer=model.to_single_str_token(target),
        wrong=None if wrong_id is None else model.to_single_str_token(wrong_id),
    )


def format_report(r: Report) -> str:
    lines = [f"Prompt: {r.prompt!r}", f"Tokens: {r.str_tokens}", "", "Top next tokens:"]
    lines += [f"  {p:7.2%}  {tok!r}" for tok, p in r.top_tokens]
    target = r.answer or r.top_tokens[0][0]
    lines += ["", f"Logit lens: rank and probability of {target!r} read off each layer's residual stream"]
    lines += [f"  {label:>14s}  rank {rank:6d}  p={p:7.2%}" for label, rank, p in r.logit_lens]
    lines += ["", "Heads attending most sharply from the final position (first token excluded):"]
    lines += [f"  {label:>7s}  {w:6.1%} on {tok!r}" for label, w, tok in r.top_heads]
    what = f"the logit of {target!r}" + ("" if r.wrong is None else f" minus the logit of {r.wrong!r}")
    lines += ["", f"Top direct contributions to {what}:"]
    lines += [f"  {label:>10s}  {c:+8.3f}" for label, c in r.attributions]
    if not r.attributions:
        lines += ["  (none: this model's output is not a sum of its components' outputs, e.g. AltUp streams)"]
    return "\n".join(lines)
