"""Sizing and saving a circuit: `smallest_circuit` and `Graph.save`/`load` on SmolLM2-135M (bundled), CPU.

The IOI batch of `benchmarks/circuits.py` is scored with EAP-IG, then:

1. `smallest_circuit` finds the smallest top-k circuit with faithfulness >= `--target`: the
   circuits it evaluated, the forwards made, its time, and its time per circuit next to one
   plain forward of the model (each circuit is one edge-patching forward);
2. the scored graph is saved with every score and loaded back: file size, times, and
   whether the reload is exact.

    python benchmarks/circuit_search.py [--threads N] [--batch 4] [--target 0.8] [--scan 8]
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch
from _machine import apply_machine_options, machine_parser
from circuits import ioi_batch, timed


def main() -> None:
    parser = machine_parser(__doc__.splitlines()[0], repeats=1)
    parser.add_argument("--batch", type=int, default=4, help="IOI prompts per batch")
    parser.add_argument("--target", type=float, default=0.8, help="faithfulness to reach")
    parser.add_argument("--scan", type=int, default=8, help="smallest_circuit's scan below the boundary")
    args = parser.parse_args()
    apply_machine_options(args)

    from hooked import HookedTransformer
    from hooked.circuits import Graph, edge_attribution_patching, smallest_circuit

    model = HookedTransformer.from_pretrained("smollm2-135m")
    clean, corrupted, metric = ioi_batch(model, args.batch)
    print(f"smollm2-135m, batch {tuple(clean.shape)}, threads {torch.get_num_threads()}")
    ig_s, graph = timed(lambda: edge_attribution_patching(model, clean, corrupted, metric, "eap-ig", verbose=False))
    print(f"EAP-IG (5 steps), {graph.n_total_edges} edges: {ig_s:.1f} s")

    with torch.no_grad():
        model(clean)  # warm-up
        forward_s = min(timed(lambda: model(clean))[0] for _ in range(3))
    search_s, found = timed(
        lambda: smallest_circuit(model, graph, clean, corrupted, metric, args.target, scan=args.scan, verbose=False)
    )
    print(found)
    print(f"top {found.k} -> {found.n_edges} edges after pruning, faithfulness {found.faithfulness:.4f}")
    print(f"smallest_circuit: {search_s:.1f} s, {len(found.evaluations)} circuits, {found.n_forwards} forwards")
    per_circuit = search_s / found.n_forwards
    print(f"per forward: {per_circuit:.2f} s = {per_circuit / forward_s:.1f}x one plain forward ({forward_s:.3f} s)")
    print(
        "evaluations (k, edges, faithfulness):", [(e.k, e.n_edges, round(e.faithfulness, 3)) for e in found.evaluations]
    )

    path = Path(tempfile.mkdtemp()) / "scores.json"
    save_s = timed(lambda: graph.save(path))[0]
    load_s, again = timed(lambda: Graph.load(path, model))
    exact = torch.equal(again.scores, graph.scores) and torch.equal(again.in_graph, graph.in_graph)
    circuit_chars = len(found.circuit.to_json())
    print(f"save {save_s:.2f} s, load {load_s:.2f} s, {path.stat().st_size / 1e6:.1f} MB, exact reload: {exact}")
    print(f"the circuit alone (to_json()): {circuit_chars / 1e3:.1f} kB")


if __name__ == "__main__":
    main()
