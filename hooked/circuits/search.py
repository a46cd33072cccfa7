"""The smallest circuit reaching a target faithfulness, searched over a graph's score order.

Candidates are the top-`k` circuits of the scores, pruned (`Graph.top_k`). They are nested,
so a circuit's pruned size grows with `k`, and its faithfulness is one exact edge-patching
forward. Were faithfulness monotone in `k`, bisection would find the smallest passing `k`
exactly in about 2 log2(k) forwards. It need not be (adding an edge that lowers the
metric can drop it below the target), so the search

1. doubles `k` from 1 until a circuit passes (circuits are usually small, and a top-`k`
   that prunes to nothing costs no forward), then bisects between the last failing and the
   first passing `k` to a boundary: a passing circuit whose next smaller circuit fails;
2. scans the next smaller distinct circuits below it one by one, and moves down to any that
   passes, until `scan` failing circuits in a row are seen;
3. reports every evaluation and each pair of circuits that contradicts monotonicity (a
   smaller one passing, a larger one failing), so a non-monotone curve is seen, not hidden.

The result is exact when faithfulness is monotone in `k`. Otherwise it is the smallest passing
circuit found: a passing circuit below a failing `k` the doubling stepped over is not seen
(raise `scan` to look further down). `monotone` False proves the curve is not monotone;
True only says that no evaluated pair contradicted it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from jaxtyping import Float, Int
from tqdm.auto import tqdm

from hooked.circuits.edge_patching import FaithfulnessEvaluator
from hooked.circuits.graph import Graph
from hooked.core.errors import InputError

Metric = Callable[[Float[torch.Tensor, "batch pos d_vocab"]], Float[torch.Tensor, ""]]


@dataclass
class Evaluation:
    """One circuit evaluated: its top-`k`, its size after pruning and its faithfulness."""

    k: int
    n_edges: int
    faithfulness: float


@dataclass
class CircuitSearch:
    """What `smallest_circuit` found and how."""

    circuit: Graph  # the smallest passing circuit found (pruned; scores as in the searched graph)
    n_edges: int  # its size after pruning
    k: int  # the top-k it was chosen with (the smallest k giving this circuit)
    faithfulness: float
    target: float
    evaluations: list[Evaluation]  # in the order made, one forward each
    n_forwards: int  # evaluations plus the 3 shared runs (reference, clean, empty circuit)
    violations: list[tuple[int, int]] = field(default_factory=list)  # (passing n_edges, larger failing n_edges)

    @property
    def monotone(self) -> bool:
        """No evaluated pair contradicts monotonicity (it does not prove the curve monotone where it was
        not evaluated)."""
        return not self.violations

    def __repr__(self) -> str:
        shape = (
            "monotone where evaluated" if self.monotone else f"NOT monotone: {len(self.violations)} contradicting pairs"
        )
        return (
            f"CircuitSearch({self.n_edges} edges (top {self.k}) at faithfulness {self.faithfulness:.4f} "
            f">= {self.target}; {len(self.evaluations)} circuits evaluated, {shape})"
        )


def smallest_circuit(
    model,
    graph: Graph,
    clean: Int[torch.Tensor, "batch pos"],
    corrupted: Int[torch.Tensor, "batch pos"],
    metric: Metric,
    target: float = 0.8,
    *,
    attention_mask: Int[torch.Tensor, "batch pos"] | None = None,
    ablation: str = "corrupted",
    absolute: bool = True,
    scan: int = 8,
    verbose: bool = True,
) -> CircuitSearch:
    """The smallest pruned top-`k` circuit of `graph`'s scores whose faithfulness is at least `target`.

    Faithfulness is as in `faithfulness` (exact edge patching, one forward per circuit).
    `scan` is how many failing circuits in a row below the bisection's boundary are checked
    for a smaller passing one (0: doubling and bisection only). A tqdm bar counts the circuits evaluated
    (`verbose=False` hides it). Raises `InputError` if even the full graph misses `target`.
    """
    if not math.isfinite(target):
        raise InputError(f"target must be a finite faithfulness (e.g. 0.8), got {target}")
    if scan < 0:
        raise InputError(f"scan must be >= 0, got {scan}")
    evaluate = FaithfulnessEvaluator(model, graph, clean, corrupted, metric, attention_mask, ablation)
    search = _Search(graph, evaluate, target, graph.edge_order(absolute))
    expected = 2 * math.ceil(math.log2(max(graph.n_total_edges, 2))) + scan
    with tqdm(
        total=expected, desc=f"circuit search (faithfulness >= {target})", unit="circuit", disable=not verbose
    ) as bar:
        search.bar = bar
        best = search.run(scan)
    below = search.next_smaller(best.k)
    k = 0 if below is None else below + 1  # the smallest k giving this circuit
    return CircuitSearch(
        circuit=search.circuit(k), n_edges=best.n_edges, k=k, faithfulness=best.faithfulness, target=target,
        evaluations=search.evaluations, n_forwards=evaluate.n_forwards, violations=search.violations(),
    )  # fmt: skip


class _Search:
    """Doubling and bisection, then a downward scan over `k`; each distinct pruned circuit is evaluated once."""

    def __init__(self, graph: Graph, evaluate: Callable[[Graph], float], target: float, order: torch.Tensor):
        self.graph, self.evaluate, self.target, self.order = graph, evaluate, target, order
        self.masks: dict[int, torch.Tensor] = {}  # k -> the pruned top-k circuit [n_senders, n_receivers]
        self.by_size: dict[int, Evaluation] = {}  # pruned size -> evaluation (nested circuits: size names the circuit)
        self.by_size[0] = Evaluation(0, 0, 0.0)  # the empty circuit is the corrupted run: 0 by definition
        self.evaluations: list[Evaluation] = []
        self.bar: tqdm | None = None  # set by `search_circuit` while the search runs

    def circuit(self, k: int) -> Graph:
        """The pruned top-`k` circuit, as a copy of the graph."""
        circuit = self.graph.copy()
        circuit.in_graph = self.mask(k).clone()
        return circuit

    def mask(self, k: int) -> torch.Tensor:
        if k not in self.masks:
            keep = torch.zeros(self.graph.valid.numel(), dtype=torch.bool)
            keep[self.order[:k]] = True
            circuit = self.graph.copy()
            circuit.in_graph = keep.view_as(self.graph.valid)
            self.masks[k] = circuit.prune().in_graph
        return self.masks[k]

    def size(self, k: int) -> int:
        return int(self.mask(k).sum())

    def at(self, k: int) -> Evaluation:
        """The evaluation of the top-`k` circuit (run once per distinct pruned circuit)."""
        n = self.size(k)
        if n not in self.by_size:
            result = Evaluation(k, n, self.evaluate(self.circuit(k)))
            self.by_size[n] = result
            self.evaluations.append(result)
            if self.bar is not None:
                self.bar.update(1)
                self.bar.set_postfix(edges=n, faithfulness=f"{result.faithfulness:.3f}")
        return self.by_size[n]

    def passes(self, k: int) -> bool:
        return self.at(k).faithfulness >= self.target

    def run(self, scan: int) -> Evaluation:
        if self.target <= 0:
            return self.at(0)
        n_total, lo, k = self.graph.n_total_edges, 0, 1
        while k < n_total and not self.passes(k):  # double k until a circuit passes (small ones prune to nothing: free)
            lo, k = k, 2 * k
        hi = min(k, n_total)
        if not self.passes(hi):
            raise InputError(
                f"no circuit of this graph reaches faithfulness {self.target}: the full graph gives "
                f"{self.at(hi).faithfulness:.6f} (1 up to rounding); ask for a lower target"
            )
        while hi - lo > 1:  # invariant: top-lo fails, top-hi passes
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if self.passes(mid) else (mid, hi)
        return self.scan_down(hi, scan)

    def scan_down(self, best_k: int, scan: int) -> Evaluation:
        """Check the distinct circuits below `best_k`, moving down to any that passes."""
        k, misses = best_k, 0
        while misses < scan:
            k = self.next_smaller(k)
            if k is None:
                break
            if self.passes(k):
                best_k, misses = k, 0
            else:
                misses += 1
        return self.at(best_k)

    def next_smaller(self, k: int) -> int | None:
        """The largest k' < k whose pruned circuit is smaller than top-k's (None: none is)."""
        n = self.size(k)
        if k == 0 or self.size(0) >= n:
            return None
        lo, hi = 0, k  # size(lo) < n <= size(hi); sizes grow with k
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if self.size(mid) < n else (lo, mid)
        return lo

    def violations(self) -> list[tuple[int, int]]:
        """(passing size, larger failing size) pairs among the evaluations."""
        done = sorted(self.by_size.values(), key=lambda e: e.n_edges)
        passing = [e.n_edges for e in done if e.faithfulness >= self.target]
        failing = [e.n_edges for e in done if e.faithfulness < self.target]
        return [(p, f) for p in passing for f in failing if f > p]
