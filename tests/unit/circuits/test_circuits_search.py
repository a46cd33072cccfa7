"""`smallest_circuit`: bisection over the score order, the downward scan, non-monotone curves reported."""

import math

import pytest
import torch

from hooked.circuits import Graph, edge_attribution_patching, faithfulness, smallest_circuit
from hooked.circuits.search import _Search
from hooked.core.errors import InputError
from tests.helpers import logit_diff
from tests.tiny_models import tiny_hooked, token_pair

torch.set_num_threads(1)


def random_scores(model, seed=0) -> Graph:
    graph = Graph.from_model(model)
    graph.scores = torch.randn(graph.scores.shape, generator=torch.Generator().manual_seed(seed)) * graph.valid
    return graph


def brute_force(model, graph, clean, corrupted):
    """Faithfulness of every distinct pruned top-k circuit: {pruned size: (smallest k, faithfulness)}."""
    out = {}
    for k in range(graph.n_total_edges + 1):
        circuit = graph.copy().top_k(k)
        if circuit.n_edges not in out:
            out[circuit.n_edges] = (k, faithfulness(model, circuit, clean, corrupted, logit_diff))
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_exhaustive_scan_finds_the_true_smallest_circuit(seed):
    model = tiny_hooked("gpt2")
    clean, corrupted = token_pair(seed=seed)
    graph = random_scores(model, seed)
    truth = brute_force(model, graph, clean, corrupted)
    target = 0.6
    smallest = min(n for n, (_, f) in truth.items() if f >= target)
    found = smallest_circuit(model, graph, clean, corrupted, logit_diff, target, scan=len(truth), verbose=False)
    assert found.n_edges == smallest and found.k == truth[smallest][0]
    assert found.faithfulness == pytest.approx(truth[smallest][1], abs=1e-6) and found.faithfulness >= target
    assert torch.equal(found.circuit.in_graph, graph.copy().top_k(found.k).in_graph)
    assert found.circuit.n_edges == found.n_edges
    passing = sorted(n for n, (_, f) in truth.items() if f >= target)
    failing = [n for n, (_, f) in truth.items() if f < target]
    contradicting = {(p, f) for p in passing for f in failing if f > p}
    evaluated = {e.n_edges for e in found.evaluations}
    assert set(found.violations) == {(p, f) for p, f in contradicting if p in evaluated and f in evaluated}
    assert found.monotone or contradicting
    # every circuit below the answer was evaluated (the scan went all the way down), so none of them passes
    assert {n for n in truth if n < found.n_edges} <= evaluated | {0}
    assert found.n_forwards == len(found.evaluations) + 3


def test_bisection_boundary_and_reported_evaluations():
    model = tiny_hooked("llama_gqa")
    clean, corrupted = token_pair()
    graph = edge_attribution_patching(model, clean, corrupted, logit_diff, method="eap-ig", verbose=False)
    found = smallest_circuit(model, graph, clean, corrupted, logit_diff, 0.8, scan=0, verbose=False)
    assert found.faithfulness >= 0.8
    assert found.faithfulness == pytest.approx(
        faithfulness(model, found.circuit, clean, corrupted, logit_diff), abs=1e-6
    )
    below = graph.copy().top_k(found.k - 1)
    assert below.n_edges < found.n_edges
    assert faithfulness(model, below, clean, corrupted, logit_diff) < 0.8  # a boundary: one circuit smaller fails
    assert len(found.evaluations) <= 2 * math.ceil(math.log2(graph.n_total_edges))
    sizes = [e.n_edges for e in found.evaluations]
    assert len(set(sizes)) == len(sizes) and found.n_edges in sizes  # each distinct circuit run once


class Curve:
    """A stand-in evaluator: faithfulness as a given function of the circuit's size."""

    def __init__(self, f):
        self.f, self.n_forwards, self.calls = f, 3, []

    def __call__(self, circuit):
        self.n_forwards += 1
        self.calls.append(circuit.n_edges)
        return self.f(circuit.n_edges)


def search_with(curve, target=0.8, scan=4):
    graph = random_scores(tiny_hooked("gpt2"))
    search = _Search(graph, curve, target, graph.edge_order())
    search.bar = type("Bar", (), {"update": lambda *a: None, "set_postfix": lambda *a, **k: None})()
    return search, search.run(scan), graph


def test_monotone_curve_is_exact_with_log_many_evaluations():
    curve = Curve(lambda n: n / 100)
    search, best, graph = search_with(curve, 0.42, scan=0)
    sizes = sorted({search.size(k) for k in range(graph.n_total_edges + 1)})
    assert best.n_edges == min(n for n in sizes if n / 100 >= 0.42)
    assert len(curve.calls) <= 2 * math.ceil(math.log2(graph.n_total_edges)) and search.violations() == []


def test_dip_below_the_target_is_scanned_past_and_reported():
    # passes from 30 edges, fails in [40, 60): bisection lands at 60, the scan walks down to the first pass
    curve = Curve(lambda n: 0.9 if n >= 60 or 30 <= n < 40 else 0.1)
    search, best, _ = search_with(curve, 0.8, scan=40)
    assert 30 <= best.n_edges < 40 and search.violations()
    smaller = [n for n in curve.calls if n < best.n_edges]
    assert smaller and all(curve.f(n) < 0.8 for n in smaller)
    # a scan too short to cross the dip stops at the boundary above it
    search, best, _ = search_with(Curve(curve.f), 0.8, scan=2)
    assert best.n_edges >= 60


def test_targets_out_of_reach_and_trivial():
    model = tiny_hooked("gpt2")
    clean, corrupted = token_pair()
    graph = random_scores(model)
    with pytest.raises(InputError, match="no circuit of this graph reaches faithfulness 1.5"):
        smallest_circuit(model, graph, clean, corrupted, logit_diff, 1.5, verbose=False)
    with pytest.raises(InputError, match="finite"):
        smallest_circuit(model, graph, clean, corrupted, logit_diff, float("nan"), verbose=False)
    found = smallest_circuit(model, graph, clean, corrupted, logit_diff, 0.0, verbose=False)
    assert found.n_edges == 0 and found.faithfulness == 0.0


def test_progress_bars_are_shown_and_hidden_with_identical_results(capsys):
    model = tiny_hooked("gpt2")
    clean, corrupted = token_pair()
    for method in ("eap", "eap-ig"):
        shown = edge_attribution_patching(model, clean, corrupted, logit_diff, method=method, steps=3)
        assert method.upper() in capsys.readouterr().err
        hidden = edge_attribution_patching(model, clean, corrupted, logit_diff, method=method, steps=3, verbose=False)
        assert capsys.readouterr().err == ""
        assert torch.equal(shown.scores, hidden.scores)
    from hooked.circuits import faithfulness_curve

    curves = []
    for verbose in (True, False):
        curves.append(faithfulness_curve(model, shown, clean, corrupted, logit_diff, [5, 20], verbose=verbose))
        assert ("faithfulness curve" in capsys.readouterr().err) == verbose
    assert curves[0] == curves[1]
    found = [smallest_circuit(model, shown, clean, corrupted, logit_diff, 0.5, verbose=v) for v in (True, False)]
    assert "circuit search" in capsys.readouterr().err
    assert found[0].evaluations == found[1].evaluations
