"""Path patching (Wang et al. 2022, the IOI circuit): the effect of senders on a metric through chosen receivers only.

On the clean run, the senders take their corrupted outputs while every other node is frozen
to its clean output; the receivers' inputs are recorded, so each receiver sees its clean
input plus the senders' direct change:

    in_r = in_r(clean) + sum_{s in senders, s upstream of r} (out_s(corrupted) - out_s(clean))

Then the clean run is repeated with the receivers' inputs set to those values and everything
downstream of them recomputed. `path_patching` takes many sender sets and evaluates them in
batched forwards (`sets_per_forward` copies of the batch per forward), one metric per set.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from jaxtyping import Float, Int

from hooked.circuits.graph import Graph
from hooked.circuits.nodes import (
    check_pair,
    collect_outputs_and_inputs,
    collect_sender_outputs,
    receiver_hooks,
    split_inputs,
)
from hooked.core.errors import InputError

Metric = Callable[[Float[torch.Tensor, "batch pos d_vocab"]], Float[torch.Tensor, ""]]


def path_patching(
    model,
    clean: Int[torch.Tensor, "batch pos"],
    corrupted: Int[torch.Tensor, "batch pos"],
    metric: Metric,
    senders: Sequence[str | Sequence[str]],
    receivers: Sequence[str],
    attention_mask: Int[torch.Tensor, "batch pos"] | None = None,
    sets_per_forward: int = 16,
) -> Float[torch.Tensor, "n_sets"]:
    """Metric after path patching each sender set in `senders` into `receivers`.

    Path patching (the IOI paper's): the senders run on `corrupted`, every other node is frozen to
    its clean value, and only the receivers' inputs see the senders' change; so the metric measures
    the effect that flows along the direct paths sender -> receiver.

    Args:
        model: the `HookedTransformer`.
        clean: tokens `[batch, pos]` of the clean prompts.
        corrupted: tokens `[batch, pos]` of the corrupted prompts (same shape).
        metric: logits `[batch, pos, d_vocab]` -> scalar.
        senders: sender sets: each a node name ("input", "a{l}.h{h}", "m{l}") or a list of them.
        receivers: receiver names ("a{l}.h{h}.q"/".k"/".v", "a{l}.h{h}" for all three, "m{l}", "logits").
        attention_mask: shared padding mask `[batch, pos]` of both batches.
        sets_per_forward: sender sets evaluated by one batched forward.

    Returns:
        The metric for each sender set, `[n_sets]`.
    """
    check_pair(clean, corrupted)
    graph = Graph.from_model(model)
    membership = _membership(graph, senders)  # [n_sets, n_senders]
    chosen = _receiver_mask(graph, receivers)  # [n_receivers]
    clean_out, clean_in = collect_outputs_and_inputs(model, graph, clean, attention_mask)
    delta = collect_sender_outputs(model, graph, corrupted, attention_mask) - clean_out  # [n_senders, batch, pos, d]
    results = []
    for sets in membership.split(sets_per_forward):
        logits = _patched_run(model, graph, clean, attention_mask, sets.to(delta), chosen, delta, clean_in)
        with torch.no_grad():
            results += [float(metric(part)) for part in logits.chunk(len(sets))]
    return torch.tensor(results)


def _membership(graph: Graph, senders) -> torch.Tensor:
    if isinstance(senders, str):
        raise InputError("senders is a list of sender sets: wrap a single node as [name] (or [[a, b]] for one set)")
    out = torch.zeros(len(senders), len(graph.senders))
    for i, group in enumerate(senders):
        for name in [group] if isinstance(group, str) else group:
            if name not in graph.sender_index:
                raise InputError(f"unknown sender {name!r}; senders are named like {graph.senders[:3]} ... 'm0'")
            out[i, graph.sender_index[name]] = 1.0
    return out


def _receiver_mask(graph: Graph, receivers: Sequence[str]) -> torch.Tensor:
    mask = torch.zeros(len(graph.receivers), dtype=torch.bool)
    for name in [receivers] if isinstance(receivers, str) else receivers:
        names = [f"{name}.{k}" for k in "qkv"] if f"{name}.q" in graph.receiver_index else [name]
        for n in names:
            if n not in graph.receiver_index:
                raise InputError(f"unknown receiver {n!r}; receivers are named like 'a1.h0.q', 'm1', 'logits'")
            mask[graph.receiver_index[n]] = True
    return mask


def _patched_run(model, graph, clean, attention_mask, sets, chosen, delta, clean_in) -> torch.Tensor:
    k = len(sets)

    def on_input(first: int, act: torch.Tensor) -> torch.Tensor | None:
        n_up, n = graph.n_upstream[first], act.shape[2]
        selected = chosen[first : first + n].to(act.device)
        if not selected.any() or n_up == 0:
            return None
        patch = torch.einsum("is,sbpd->ibpd", sets[:, :n_up], delta[:n_up]).flatten(0, 1)  # [k * batch, pos, d_model]
        base = clean_in[first].repeat(k, 1, 1)  # [k * batch, pos, d_model]
        out = act.clone()
        out[:, :, selected] = (base + patch)[:, :, None]
        return out

    tokens = clean.repeat(k, 1)
    mask = None if attention_mask is None else attention_mask.repeat(k, 1)
    with torch.no_grad(), split_inputs(model):
        return model.run_with_hooks(tokens, attention_mask=mask, fwd_hooks=receiver_hooks(model, graph, on_input))
