"""Circuit-discovery cost: EAP over all edges vs exact edge-by-edge patching, and EAP-IG cost per step.

SmolLM2-135M (bundled), a batch of IOI prompts (one template, single-token names), float32, CPU.

1. EAP scores every edge of the residual graph in 2 forwards + 1 backward. Exact
   edge-by-edge patching (the reference, what ACDC-style search pays for each edge it
   tests) costs one forward per edge: it is timed on `--edges` random edges, sharing one
   corrupted reference run, and extrapolated to all edges (stated in the output). The
   ratio is extrapolated exact time / EAP time; the correlation of EAP scores with the
   exact effects on the sampled edges is printed too.
2. EAP-IG's cost per step is the slope of its time between `--steps` and 2x`--steps`
   (one step per forward, `steps_per_forward=1`), compared with one plain forward +
   backward of the model on the same batch.

    python benchmarks/circuits.py [--repeats 3] [--threads N] [--edges 20] [--steps 5] [--batch 6]
"""

from __future__ import annotations

import random
import statistics
import time
from functools import partial

import torch
from _machine import apply_machine_options, machine_parser

NAMES = ["Mary", "John", "Tom", "James", "Dan", "Sarah", "Anna", "Paul", "Mark", "Lisa", "Kate", "David"]
TEMPLATE = "When{A} and{B} went to the store,{S} gave a drink to"


def ioi_batch(model, batch: int):
    """Clean/corrupted (ABC) IOI tokens and the logit-difference metric."""
    rng = random.Random(0)
    clean, corrupted, answers, subjects = [], [], [], []
    for _ in range(batch):
        a, b, c = (" " + n for n in rng.sample(NAMES, 3))
        clean.append(TEMPLATE.format(A=a, B=b, S=b))
        corrupted.append(TEMPLATE.format(A=a, B=b, S=c))
        answers.append(model.to_single_token(a))
        subjects.append(model.to_single_token(b))
    answers, subjects = torch.tensor(answers), torch.tensor(subjects)

    def metric(logits: torch.Tensor) -> torch.Tensor:
        last = logits[:, -1]  # [batch, d_vocab]
        return (last.gather(1, answers[:, None]) - last.gather(1, subjects[:, None])).mean()

    return model.to_tokens(clean), model.to_tokens(corrupted), metric


def timed(fn) -> tuple[float, object]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def forward_backward(model, tokens, metric) -> None:
    """One plain forward and backward (gradient to the embeddings only, as EAP takes it)."""
    leaf = []
    hook = ("hook_embed", lambda act, hook: leaf.append(act.detach().requires_grad_(True)) or leaf[-1])
    with torch.enable_grad(), model.hooks(fwd_hooks=[hook]):
        torch.autograd.grad(metric(model(tokens)), leaf)


def exact_edges(model, graph, clean, corrupted, metric, edges) -> tuple[float, list[float]]:
    """Seconds per edge and the exact effects of removing each of `edges` alone from the full graph."""
    from hooked.circuits.edge_patching import corrupted_values, run_circuit

    reference = corrupted_values(model, graph, corrupted)
    with torch.no_grad():
        base = metric(model(clean)).item()
    effects, start = [], time.perf_counter()
    for s, r in edges:
        g = graph.copy()
        g.in_graph = graph.valid.clone()
        g.in_graph[s, r] = False
        with torch.no_grad():
            effects.append(base - metric(run_circuit(model, g, clean, reference)).item())
    return (time.perf_counter() - start) / len(edges), effects


def main() -> None:
    parser = machine_parser(__doc__.splitlines()[0], repeats=3)
    parser.add_argument("--edges", type=int, default=20, help="edges patched exactly (extrapolated to all)")
    parser.add_argument("--steps", type=int, default=5, help="EAP-IG steps (also timed at twice this)")
    parser.add_argument("--batch", type=int, default=6, help="IOI prompts per batch")
    args = parser.parse_args()
    apply_machine_options(args)

    from hooked import HookedTransformer
    from hooked.circuits import edge_attribution_patching

    model = HookedTransformer.from_pretrained("smollm2-135m")
    clean, corrupted, metric = ioi_batch(model, args.batch)
    print(f"smollm2-135m, batch {tuple(clean.shape)}, threads {torch.get_num_threads()}")

    forward_backward(model, clean, metric)  # warm-up
    eap_t, fb_t, ig_t, ig2_t, exact_t = [], [], [], [], []
    for _ in range(args.repeats):
        t, graph = timed(lambda: edge_attribution_patching(model, clean, corrupted, metric, verbose=False))
        eap_t.append(t)
        fb_t.append(timed(lambda: forward_backward(model, clean, metric))[0])
        for steps, out in ((args.steps, ig_t), (2 * args.steps, ig2_t)):
            ig = partial(
                edge_attribution_patching,
                model,
                clean,
                corrupted,
                metric,
                "eap-ig",
                steps,
                steps_per_forward=1,
                verbose=False,
            )
            out.append(timed(ig)[0])
        valid = graph.valid.nonzero().tolist()
        edges = random.Random(1).sample(valid, args.edges)
        per_edge, effects = exact_edges(model, graph, clean, corrupted, metric, edges)
        exact_t.append(per_edge)

    eap, fb, per_edge = statistics.median(eap_t), statistics.median(fb_t), statistics.median(exact_t)
    n = graph.n_total_edges
    print(f"edges in the graph: {n} ({len(graph.senders)} senders x {len(graph.receivers)} receivers, upstream only)")
    print(f"EAP, all edges:                         {eap:8.2f} s")
    print(f"exact patching, per edge (on {args.edges}):      {per_edge:8.3f} s")
    print(f"exact patching, all edges (extrapolated): {per_edge * n:8.0f} s  -> {per_edge * n / eap:,.0f}x EAP")
    scores = torch.tensor([graph.scores[s, r].item() for s, r in edges])
    corr = torch.corrcoef(torch.stack([scores, torch.tensor(effects)]))[0, 1].item()
    print(f"correlation of EAP with the exact effects on the sampled edges: {corr:.3f}")
    per_step = (statistics.median(ig2_t) - statistics.median(ig_t)) / args.steps
    print(f"one forward + backward:                 {fb:8.3f} s")
    print(f"EAP-IG {args.steps} steps: {statistics.median(ig_t):.2f} s, {2 * args.steps} steps: "
          f"{statistics.median(ig2_t):.2f} s -> {per_step:.3f} s per step = {per_step / fb:.2f}x "
          "a forward + backward")  # fmt: skip


if __name__ == "__main__":
    main()
