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

from typing import Callable

import torch
from jaxtyping import Float, Int

from hooked.circuits.graph import Graph
from hooked.circuits.nodes import check_pair, collect_sender_outputs, receiver_hooks, sender_hooks, split_inputs
from hooked.errors import InputError

Metric = Callable[[Float[torch.Tensor, "batch pos d_vocab"]], Float[torch.Tensor, ""]]


def corrupted_values(
    model, graph: Graph, corrupted, attention_mask=None, ablation: str = "corrupted"
) -> Float[torch.Tensor, "n_senders batch pos d_model"]:
    """Senders' replacement outputs: from the `corrupted` run, or their mean over its batch (`ablation="mean"`)."""
    if ablation not in ("corrupted", "mean"):
        raise InputError(f"ablation must be 'corrupted' or 'mean', got {ablation!r}")
    out = collect_sender_outputs(model, graph, corrupted, attention_mask)  # [n_senders, batch, pos, d_model]
    if ablation == "mean":
        if attention_mask is None:
            return out.mean(1, keepdim=True).expand_as(out)
        w = attention_mask.to(out.device, out.dtype)[None, :, :, None]  # [1, batch, pos, 1]
        return ((out * w).sum(1, keepdim=True) / w.sum(1, keepdim=True).clamp(min=1)).expand_as(out)
    return out


def run_circuit(
    model,
    graph: Graph,
    clean: Int[torch.Tensor, "batch pos"],
    corrupted_out: Float[torch.Tensor, "n_senders batch pos d_model"],
    attention_mask: Int[torch.Tensor, "batch pos"] | None = None,
) -> Float[torch.Tensor, "batch pos d_vocab"]:
    """Logits of `clean` with every edge outside `graph.in_graph` patched to `corrupted_out`."""
    removed = (graph.valid & ~graph.in_graph).to(corrupted_out.dtype)  # [n_senders, n_receivers]
    diff = torch.zeros_like(corrupted_out)  # out_u(this run) - out_u(corrupted), filled in forward order
    upstream = graph.n_upstream

    def on_output(first: int, out: torch.Tensor) -> None:
        n = out.shape[2]
        diff[first : first + n] = out.permute(2, 0, 1, 3) - corrupted_out[first : first + n]

    def on_input(first: int, act: torch.Tensor) -> torch.Tensor | None:
        n_up, n = upstream[first], act.shape[2]
        weights = removed[:n_up, first : first + n]  # [n_up, n]
        if not weights.any():
            return None
        return act - torch.einsum("sbpd,sn->bpnd", diff[:n_up], weights)  # [batch, pos, n, d_model]

    hooks = sender_hooks(model, graph, on_output) + receiver_hooks(model, graph, on_input)
    with torch.no_grad(), split_inputs(model):
        return model.run_with_hooks(clean, attention_mask=attention_mask, fwd_hooks=hooks)


def edge_patching(
    model,
    graph: Graph,
    clean: Int[torch.Tensor, "batch pos"],
    corrupted: Int[torch.Tensor, "batch pos"],
    attention_mask: Int[torch.Tensor, "batch pos"] | None = None,
    ablation: str = "corrupted",
) -> Float[torch.Tensor, "batch pos d_vocab"]:
    """Logits of the circuit `graph` on `clean`, edges outside it from `corrupted` (or its mean)."""
    check_pair(clean, corrupted)
    corrupted_out = corrupted_values(model, graph, corrupted, attention_mask, ablation)
    return run_circuit(model, graph, clean, corrupted_out, attention_mask)


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
    """
    check_pair(clean, corrupted)
    corrupted_out = corrupted_values(model, graph, corrupted, attention_mask, ablation)
    with torch.no_grad():
        m_clean = float(metric(model(clean, attention_mask=attention_mask)))
        empty = graph.copy()
        empty.in_graph = torch.zeros_like(empty.valid)
        m_corrupted = float(metric(run_circuit(model, empty, clean, corrupted_out, attention_mask)))
        m_circuit = float(metric(run_circuit(model, graph, clean, corrupted_out, attention_mask)))
    if m_clean == m_corrupted:
        raise InputError("metric(clean) equals metric(corrupted): faithfulness is undefined for this pair")
    return (m_circuit - m_corrupted) / (m_clean - m_corrupted)
