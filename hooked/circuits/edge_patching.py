"""Exact edge patching: run a circuit alone, every edge outside it carrying its corrupted (or mean) value.

The model runs on the clean input in split-input mode. Each sender's output in this run is
recorded as it is produced, and each receiver's input is its residual copy minus the
contributions of its upstream senders whose edge is not in the circuit, plus their
corrupted values:

    in_v = resid_v - sum_{u -> v not in circuit} (out_u(this run) - out_u(corrupted))

Every node is recomputed from its own patched inputs, so the full graph gives the clean
run and the empty graph the corrupted run exactly (up to float rounding). One batched
einsum per receiver hook applies all removed edges at once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch
from jaxtyping import Float, Int
from tqdm.auto import tqdm

from hooked.circuits.graph import Graph
from hooked.circuits.nodes import check_pair, collect_outputs_and_inputs, receiver_hooks, sender_hooks, split_inputs
from hooked.core.errors import InputError

Metric = Callable[[Float[torch.Tensor, "batch pos d_vocab"]], Float[torch.Tensor, ""]]


@dataclass
class Reference:
    """What edges outside a circuit carry: senders' outputs and receivers' unpatched inputs in the reference run."""

    outputs: Float[torch.Tensor, "n_senders batch pos d_model"]
    inputs: dict[int, torch.Tensor]  # first receiver of a group -> [batch, pos, d_model]


def corrupted_values(model, graph: Graph, corrupted, attention_mask=None, ablation: str = "corrupted") -> Reference:
    """The reference run: `corrupted` itself, or its mean over the batch (`ablation="mean"`)."""
    if ablation not in ("corrupted", "mean"):
        raise InputError(f"ablation must be 'corrupted' or 'mean', got {ablation!r}")
    out, inputs = collect_outputs_and_inputs(model, graph, corrupted, attention_mask)
    if ablation == "corrupted":
        return Reference(out, inputs)
    mean = partial(_batch_mean, mask=attention_mask)
    return Reference(mean(out, dim=1), {k: mean(v, dim=0) for k, v in inputs.items()})


def _batch_mean(x: torch.Tensor, dim: int, mask=None) -> torch.Tensor:
    """Mean over the batch axis `dim` (real tokens only where `mask` is given), broadcast back."""
    if mask is None:
        return x.mean(dim, keepdim=True).expand_as(x)
    w = mask.to(x.device, x.dtype)[(None,) * dim + (...,)]  # [(1,) batch, pos]
    w = w.reshape(*w.shape, *([1] * (x.ndim - w.ndim)))
    return ((x * w).sum(dim, keepdim=True) / w.sum(dim, keepdim=True).clamp(min=1)).expand_as(x)


def run_circuit(
    model,
    graph: Graph,
    clean: Int[torch.Tensor, "batch pos"],
    reference: Reference,
    attention_mask: Int[torch.Tensor, "batch pos"] | None = None,
) -> Float[torch.Tensor, "batch pos d_vocab"]:
    """Logits of `clean` with every edge outside `graph.in_graph` carrying its `reference` value.

    Each receiver group takes the cheaper of two equal forms, summing over the fewer senders:
    its input minus the removed edges' differences, or the reference input plus the kept ones'.
    """
    kept_all, removed_all = graph.in_graph & graph.valid, graph.valid & ~graph.in_graph
    diff = torch.zeros_like(reference.outputs)  # out_u(this run) - out_u(reference), filled in forward order

    def on_output(first: int, out: torch.Tensor) -> None:
        n = out.shape[2]
        diff[first : first + n] = out.permute(2, 0, 1, 3) - reference.outputs[first : first + n]

    def on_input(first: int, act: torch.Tensor) -> torch.Tensor | None:
        n_up, n = graph.n_upstream[first], act.shape[2]
        kept, removed = kept_all[:n_up, first : first + n], removed_all[:n_up, first : first + n]  # [n_up, n]
        use_kept, use_removed = kept.any(1).nonzero()[:, 0], removed.any(1).nonzero()[:, 0]
        if len(use_removed) == 0:
            return None
        if len(use_kept) <= len(use_removed):
            base = reference.inputs[first][:, :, None].expand_as(act)  # [batch, pos, n, d_model]
            weights = kept[use_kept].to(diff)
            return base + _weighted_sum(diff[use_kept], weights) if len(use_kept) else base.contiguous()
        return act - _weighted_sum(diff[use_removed], removed[use_removed].to(diff))

    hooks = sender_hooks(model, graph, on_output) + receiver_hooks(model, graph, on_input)
    with torch.no_grad(), split_inputs(model):
        return model.run_with_hooks(clean, attention_mask=attention_mask, fwd_hooks=hooks)


def _weighted_sum(
    diff: Float[torch.Tensor, "s batch pos d_model"], weights: Float[torch.Tensor, "s n"]
) -> Float[torch.Tensor, "batch pos n d_model"]:
    """`sum_s weights[s, n] * diff[s]` as one matmul (faster than einsum on CPU)."""
    s, batch, pos, d_model = diff.shape
    out = weights.T @ diff.reshape(s, -1)  # [n, batch * pos * d_model]
    return out.view(-1, batch, pos, d_model).permute(1, 2, 0, 3)  # [batch, pos, n, d_model]


def edge_patching(
    model,
    graph: Graph,
    clean: Int[torch.Tensor, "batch pos"],
    corrupted: Int[torch.Tensor, "batch pos"],
    attention_mask: Int[torch.Tensor, "batch pos"] | None = None,
    ablation: str = "corrupted",
) -> Float[torch.Tensor, "batch pos d_vocab"]:
    """Logits of the circuit `graph` on `clean`, edges outside it from `corrupted` (or its mean).

    Exact: one forward in which every edge outside the circuit carries its corrupted value.

    Args:
        model: the `HookedTransformer`.
        graph: the circuit: a `Graph` whose `in_graph` marks the kept edges.
        clean: tokens `[batch, pos]` the circuit runs on.
        corrupted: tokens `[batch, pos]` whose activations the removed edges carry (same shape).
        attention_mask: shared padding mask `[batch, pos]` of both batches.
        ablation: "corrupted" (each removed edge from the same corrupted prompt) or "mean"
            (from the mean over the corrupted batch).

    Returns:
        Logits `[batch, pos, d_vocab]`.
    """
    check_pair(clean, corrupted)
    reference = corrupted_values(model, graph, corrupted, attention_mask, ablation)
    return run_circuit(model, graph, clean, reference, attention_mask)


class FaithfulnessEvaluator:
    """Faithfulness of many circuits of one graph on one clean/corrupted pair.

    The reference (corrupted or mean) values, the clean metric and the empty circuit's
    metric are computed once (3 forwards); each circuit then costs one forward (`n_forwards` counts all).
    """

    def __init__(
        self, model, graph: Graph, clean, corrupted, metric: Metric, attention_mask=None, ablation="corrupted"
    ):
        check_pair(clean, corrupted)
        self.model, self.clean, self.metric, self.attention_mask = model, clean, metric, attention_mask
        self.reference = corrupted_values(model, graph, corrupted, attention_mask, ablation)
        empty = graph.copy()
        empty.in_graph = torch.zeros_like(empty.valid)
        with torch.no_grad():
            self.m_clean = float(metric(model(clean, attention_mask=attention_mask)))
        self.n_forwards = 2  # the reference run and the clean run
        self.m_corrupted = self.metric_of(empty)
        if self.m_clean == self.m_corrupted:
            raise InputError("metric(clean) equals metric(corrupted): faithfulness is undefined for this pair")

    def metric_of(self, circuit: Graph) -> float:
        """The metric of the circuit run alone (one forward)."""
        self.n_forwards += 1
        with torch.no_grad():
            return float(self.metric(run_circuit(self.model, circuit, self.clean, self.reference, self.attention_mask)))

    def __call__(self, circuit: Graph) -> float:
        """`(m(circuit) - m(corrupted)) / (m(clean) - m(corrupted))`."""
        return (self.metric_of(circuit) - self.m_corrupted) / (self.m_clean - self.m_corrupted)


def faithfulness(
    model,
    graph: Graph,
    clean: Int[torch.Tensor, "batch pos"],
    corrupted: Int[torch.Tensor, "batch pos"],
    metric: Metric,
    attention_mask: Int[torch.Tensor, "batch pos"] | None = None,
    ablation: str = "corrupted",
) -> float:
    """How much of the model's behaviour the circuit keeps: `(m(circuit) - m(corrupted)) / (m(clean) - m(corrupted))`.

    1 means the circuit alone recovers the clean metric; 0 means it does no better than
    the corrupted run (the empty circuit, with the same `ablation`).

    Args:
        model: the `HookedTransformer`.
        graph: the circuit: a `Graph` whose `in_graph` marks the kept edges.
        clean: tokens `[batch, pos]` the circuit runs on.
        corrupted: tokens `[batch, pos]` whose activations the removed edges carry (same shape).
        metric: logits `[batch, pos, d_vocab]` -> scalar.
        attention_mask: shared padding mask `[batch, pos]` of both batches.
        ablation: "corrupted" or "mean", as in `edge_patching`.

    Returns:
        The fraction of the clean-vs-corrupted metric difference the circuit keeps.
    """
    return FaithfulnessEvaluator(model, graph, clean, corrupted, metric, attention_mask, ablation)(graph)


def faithfulness_curve(
    model,
    graph: Graph,
    clean: Int[torch.Tensor, "batch pos"],
    corrupted: Int[torch.Tensor, "batch pos"],
    metric: Metric,
    sizes: list[int],
    attention_mask: Int[torch.Tensor, "batch pos"] | None = None,
    ablation: str = "corrupted",
    *,
    verbose: bool = True,
) -> list[tuple[int, float]]:
    """`(edges kept, faithfulness)` of the top-`k` circuit of `graph`'s scores for each `k` in `sizes`.

    "Edges kept" is the circuit's size after pruning, at most `k` (edges off every
    input-to-logits path change nothing and are dropped). Faithfulness need not grow with `k`;
    `smallest_circuit` searches for the smallest circuit reaching a target. The reference,
    clean and empty runs are shared, so each size costs one forward; a tqdm bar counts the
    circuits (`verbose=False` hides it).

    Args:
        model: the `HookedTransformer`.
        graph: a scored `Graph` (from `edge_attribution_patching`); it is not modified.
        clean: tokens `[batch, pos]` the circuits run on.
        corrupted: tokens `[batch, pos]` whose activations the removed edges carry (same shape).
        metric: logits `[batch, pos, d_vocab]` -> scalar.
        sizes: the circuit sizes k (edges kept) to evaluate.
        attention_mask: shared padding mask `[batch, pos]` of both batches.
        ablation: "corrupted" or "mean", as in `edge_patching`.
        verbose: show the progress bar.

    Returns:
        `(edges kept after pruning, faithfulness)` for each size.
    """
    evaluate = FaithfulnessEvaluator(model, graph, clean, corrupted, metric, attention_mask, ablation)
    out = []
    for k in tqdm(sizes, desc="faithfulness curve", unit="circuit", disable=not verbose):
        circuit = graph.copy().top_k(k)
        out.append((circuit.n_edges, evaluate(circuit)))
    return out
