"""Edge attribution patching (Syed et al. 2023) and EAP with integrated gradients (Hanna et al. 2024).

An edge u -> v's score is the first-order estimate of what corrupting that one edge costs:

    score(u -> v) = (out_u(clean) - out_u(corrupted)) . d metric / d in_v

summed over batch and positions. `"eap"` takes the gradient on the clean run (2 forwards,
1 backward for every edge at once); `"eap-ig"` averages it over `steps` runs whose input
embedding (the residual entering block 0) moves from corrupted to clean (midpoints
alpha = (i + 0.5) / steps), which makes the scores of a cut add up to
`metric(clean) - metric(corrupted)`. The contractions are one einsum per receiver hook over
all its upstream senders; nothing loops over edges.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import torch
from jaxtyping import Float, Int
from tqdm.auto import tqdm

from hooked.circuits.graph import Graph
from hooked.circuits.nodes import (
    check_pair,
    collect_sender_outputs,
    masked,
    receiver_hooks,
    sender_hooks,
    split_inputs,
)
from hooked.core.errors import InputError

Metric = Callable[[Float[torch.Tensor, "batch pos d_vocab"]], Float[torch.Tensor, ""]]


def edge_attribution_patching(
    model,
    clean: Int[torch.Tensor, "batch pos"],
    corrupted: Int[torch.Tensor, "batch pos"],
    metric: Metric,
    method: str = "eap",
    steps: int = 5,
    attention_mask: Int[torch.Tensor, "batch pos"] | None = None,
    steps_per_forward: int | None = None,
    *,
    verbose: bool = True,
) -> Graph:
    """Score every edge of `Graph.from_model(model)`; returns the graph (all edges in, scores set).

    An edge u -> v scores `(out_u(clean) - out_u(corrupted)) . grad in_v`: the first-order
    estimate of how much the metric changes when that one edge carries its corrupted value.

    Args:
        model: the `HookedTransformer`.
        clean: tokens `[batch, pos]` of the clean prompts.
        corrupted: tokens `[batch, pos]` of the corrupted prompts (same shape).
        metric: logits `[batch, pos, d_vocab]` of the `clean`-sized batch -> scalar.
        method: "eap" (gradient at the clean run) or "eap-ig" (`steps` interpolated inputs).
        steps: interpolation points of "eap-ig".
        attention_mask: shared padding mask `[batch, pos]` of both batches (their positions must line up).
        steps_per_forward: EAP-IG steps stacked into one batched forward (default: all);
            lower it to bound memory (and see the progress bar move more often).
        verbose: a tqdm bar counts the runs (2 for "eap", 2 + `steps` for "eap-ig");
            `False` hides it.

    Returns:
        The `Graph` with `scores` `[n_senders, n_receivers]` set; choose a circuit with
        `.top_k(k)` or `.threshold(t)`.
    """
    if method not in ("eap", "eap-ig"):
        raise InputError(f"method must be 'eap' or 'eap-ig', got {method!r}")
    if steps < 1:
        raise InputError(f"steps must be at least 1, got {steps}")
    check_pair(clean, corrupted)
    graph = Graph.from_model(model)
    total = 2 if method == "eap" else 2 + steps
    with tqdm(total=total, desc=method.upper(), unit="run", disable=not verbose) as bar:
        corrupted_out = collect_sender_outputs(model, graph, corrupted, attention_mask)
        bar.update(1)
        if method == "eap":
            graph.scores = _eap_scores(model, graph, clean, corrupted_out, metric, attention_mask)
            bar.update(1)
        else:
            clean_out = collect_sender_outputs(model, graph, clean, attention_mask)
            bar.update(1)
            diff = masked(clean_out - corrupted_out, attention_mask)
            start, delta = corrupted_out[0], clean_out[0] - corrupted_out[0]  # the input node: [batch, pos, d_model]
            graph.scores = _ig_scores(
                model, graph, clean, (start, delta, diff), metric, attention_mask, steps, steps_per_forward, bar
            )
    return graph


def _scoring_hooks(model, graph: Graph, diff: list, scores: torch.Tensor, repeats: int):
    """Receiver hooks adding `diff[:n_upstream] . grad(input)` to `scores` during the backward pass."""
    upstream = graph.n_upstream

    def on_input(first: int, act: torch.Tensor) -> None:
        if not act.requires_grad:
            return

        def accumulate(grad: torch.Tensor) -> None:
            n = upstream[first]
            grad = grad.view(repeats, -1, *grad.shape[1:]).sum(0)  # [batch, pos, n, d_model]
            d = diff[0][:n].to(grad.dtype)  # [n_up, batch, pos, d_model]
            m = grad.shape[2]
            flat = grad.permute(2, 0, 1, 3).reshape(m, -1)  # [n, batch * pos * d_model]
            scores[:n, first : first + m] += (d.reshape(n, -1) @ flat.T).float()  # sum over batch, pos, d_model

        act.register_hook(accumulate)

    return receiver_hooks(model, graph, on_input)


def _leaf(act: torch.Tensor) -> torch.Tensor:
    """`act` as a fresh leaf needing a gradient: gradients stop here, so no parameter's `.grad` is touched."""
    return act.detach().requires_grad_(True)


def _eap_scores(model, graph, clean, corrupted_out, metric, attention_mask) -> torch.Tensor:
    scores = torch.zeros(len(graph.senders), len(graph.receivers), device=corrupted_out.device)
    diff: list = [None]

    def save_clean(first: int, out: torch.Tensor) -> None:
        if diff[0] is None:
            diff[0] = torch.zeros_like(corrupted_out)
        diff[0][first : first + out.shape[2]] = out.detach().permute(2, 0, 1, 3)  # [n, batch, pos, d_model]

    leaf: list = []
    hooks = [("blocks.0.hook_resid_pre", lambda act, hook: leaf.append(_leaf(act)) or leaf[-1])]
    hooks += sender_hooks(model, graph, save_clean) + _scoring_hooks(model, graph, diff, scores, 1)
    with torch.enable_grad(), split_inputs(model), model.hooks(fwd_hooks=hooks):
        value = _scalar(metric(model(clean, attention_mask=attention_mask)))
        diff[0] = masked(diff[0] - corrupted_out, attention_mask)
        torch.autograd.grad(value, leaf)
    return scores.cpu()


def _ig_scores(model, graph, clean, diffs, metric, attention_mask, steps, steps_per_forward, bar) -> torch.Tensor:
    start, delta, diff = diffs
    scores = torch.zeros(len(graph.senders), len(graph.receivers), device=diff.device)
    alphas = (torch.arange(steps, dtype=torch.float32) + 0.5) / steps
    for chunk in alphas.split(steps_per_forward or steps):
        k = len(chunk)
        a = chunk.to(start.device, start.dtype).view(k, 1, 1, 1)
        leaf: list = []

        def interpolate(act, hook, a=a, leaf=leaf):
            x = (start[None] + a * delta[None]).flatten(0, 1)  # [k * batch, pos, d_model]
            leaf.append(_leaf(x))
            return leaf[-1]

        hooks = [("blocks.0.hook_resid_pre", interpolate)] + _scoring_hooks(model, graph, [diff], scores, k)
        tokens = clean.repeat(k, 1)
        mask = None if attention_mask is None else attention_mask.repeat(k, 1)
        with torch.enable_grad(), split_inputs(model), model.hooks(fwd_hooks=hooks):
            logits = model(tokens, attention_mask=mask)
            # sum() of tensors is typed `Tensor | Literal[0]`; it is a tensor here (k >= 1)
            value = cast(torch.Tensor, sum(_scalar(metric(part)) for part in logits.chunk(k)))
            torch.autograd.grad(value, leaf)
        bar.update(k)
    return scores.cpu() / steps


def _scalar(value: torch.Tensor) -> torch.Tensor:
    if not isinstance(value, torch.Tensor) or value.numel() != 1:
        shape = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
        raise InputError(f"metric must return a scalar tensor, got {shape}: reduce over the batch (e.g. .mean())")
    return value.reshape(())
