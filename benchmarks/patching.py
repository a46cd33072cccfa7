"""Activation-patching speed: hooked's batched `get_act_patch_resid_pre` vs a naive loop, side by side.

SmolLM2-135M (bundled), a 20-token factual-recall prompt pair, float32, CPU. The naive
loop is what one would write by hand: one `run_with_hooks` forward per (layer, pos),
batch 1, under no_grad. Each repeat times both, interleaved, and the script prints
medians, their ratio (target <= 0.3) and the largest difference between the two
result grids.

    python benchmarks/patching.py [--repeats 3] [--threads N]
"""

from __future__ import annotations

import statistics
import time

import torch
from _machine import apply_machine_options, machine_parser

CLEAN = "After a long journey we finally arrived at the Eiffel Tower, which is in the city of"
CORRUPTED = "After a long journey we finally arrived at the Colosseum, which is in the city of"


def naive_resid_pre_patch(model, corrupted_tokens, clean_cache, metric) -> torch.Tensor:
    """One forward per (layer, pos): the reference and the baseline."""
    n_layers, n_pos = model.cfg.n_layers, corrupted_tokens.shape[-1]
    out = torch.zeros(n_layers, n_pos)
    for layer in range(n_layers):
        name = f"blocks.{layer}.hook_resid_pre"
        clean = clean_cache[name]
        for pos in range(n_pos):

            def hook(act, hook, pos=pos, clean=clean):
                act[:, pos] = clean[:, pos]
                return act

            out[layer, pos] = metric(model.run_with_hooks(corrupted_tokens, fwd_hooks=[(name, hook)])).item()
    return out


def main() -> None:
    parser = machine_parser(__doc__.splitlines()[0], repeats=3)
    args = parser.parse_args()
    apply_machine_options(args)

    from hooked import HookedTransformer
    from hooked.analysis.patching import get_act_patch_resid_pre

    model = HookedTransformer.from_pretrained("smollm2-135m")
    clean_tokens, corrupted_tokens = model.to_tokens(CLEAN), model.to_tokens(CORRUPTED)
    assert clean_tokens.shape == corrupted_tokens.shape == (1, 20), (clean_tokens.shape, corrupted_tokens.shape)
    paris, rome = model.to_single_token(" Paris"), model.to_single_token(" Rome")

    def metric(logits: torch.Tensor) -> torch.Tensor:
        return (logits[:, -1, paris] - logits[:, -1, rome]).mean()

    with torch.no_grad():
        _, clean_cache = model.run_with_cache(clean_tokens)
        variants = {
            "hooked get_act_patch_resid_pre": lambda: get_act_patch_resid_pre(
                model, corrupted_tokens, clean_cache, metric
            ),
            "naive loop (1 forward per patch)": lambda: naive_resid_pre_patch(
                model, corrupted_tokens, clean_cache, metric
            ),
        }
        times: dict[str, list[float]] = {name: [] for name in variants}
        results: dict[str, torch.Tensor] = {}
        model(corrupted_tokens)  # warm-up
        for _ in range(args.repeats):
            for name, fn in variants.items():
                start = time.perf_counter()
                results[name] = fn()
                times[name].append(time.perf_counter() - start)

    batched, naive = results.values()
    med = {name: statistics.median(ts) for name, ts in times.items()}
    n_patches = model.cfg.n_layers * corrupted_tokens.shape[-1]
    print(
        f"SmolLM2-135M, resid_pre patching over {model.cfg.n_layers} layers x {corrupted_tokens.shape[-1]} positions "
        f"= {n_patches} patches, float32, {torch.get_num_threads()} threads, median of {args.repeats}"
    )
    for name, t in med.items():
        print(
            f"  {name:34s} {t:7.2f} s  ({t / n_patches * 1000:5.1f} ms per patch)  runs: "
            + ", ".join(f"{x:.2f}" for x in times[name])
        )
    ratio = med["hooked get_act_patch_resid_pre"] / med["naive loop (1 forward per patch)"]
    print(f"  ratio hooked / naive = {ratio:.3f}  (target <= 0.3)")
    print(f"  max |hooked - naive| = {(batched.cpu() - naive).abs().max().item():.3e}")


if __name__ == "__main__":
    main()
