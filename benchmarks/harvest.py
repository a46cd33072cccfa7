"""Harvest speed: tokens/s of `hooked.harvest` (writing shards to disk) vs a bare forward loop on the same batches.

The bare loop is `model(tokens, stop_at_layer=L + 1)` over the same token batches; the ratio shows how
much the harvest (cache the hook, convert, copy to host, write safetensors on a background thread)
costs on top of the forward it cannot avoid (goal >= 0.9x). When SAELens runs (installed
with --no-deps, on hooked through `alias_transformer_lens`), its `ActivationsStore` makes the same
activations in memory (get_batch_tokens + get_activations, no disk) on the same pre-tokenized rows.
Each repeat runs every variant once, interleaved; medians are printed.

    python benchmarks/harvest.py [--model smollm2-135m] [--hook blocks.14.hook_resid_post] [--context-length 128]
                                 [--batch-size 8] [--batches 8] [--dtype float16] [--repeats 3] [--threads N]
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch
from _machine import apply_machine_options, machine_parser

from hooked.harvest.hooks import stop_layer

ROOT = Path(__file__).resolve().parents[1]


def token_rows(model, n_rows: int, context_length: int) -> torch.Tensor:
    """`[n_rows, context_length]` contexts (BOS + text, TransformerLens style) from this repository's docs and code."""
    from hooked.harvest.corpus import Corpus, iter_contexts

    files = sorted(ROOT.glob("*.md")) + sorted((ROOT / "hooked").glob("*.py"))
    tmp = Path(tempfile.mkdtemp()) / "corpus.txt"
    tmp.write_text("\n\n".join(f.read_text() for f in files))
    rows = []
    for tokens, _ in iter_contexts(Corpus(tmp), model.tokenizer, context_length):
        rows.append(tokens)
        if len(rows) == n_rows:
            return torch.stack(rows)
    raise SystemExit(f"the repository text gives only {len(rows)} contexts; ask for fewer --batches")


def main() -> None:
    parser = machine_parser(__doc__.splitlines()[0], repeats=3)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--hook", default="blocks.14.hook_resid_post")
    parser.add_argument("--context-length", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument("--dtype", default="float16", help="dtype of the stored activations")
    parser.add_argument("--device", default=None)
    parser.add_argument("--skip-sae-lens", action="store_true")
    args = parser.parse_args()
    apply_machine_options(args)
    from hooked import HookedTransformer
    from hooked.harvest import harvest

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    model = HookedTransformer.from_pretrained(args.model, device=device)
    stop = stop_layer([args.hook], model.cfg.n_layers)
    rows = token_rows(model, args.batch_size * args.batches, args.context_length)
    work = Path(tempfile.mkdtemp(prefix="harvest-bench-"))
    torch.save(rows, work / "tokens.pt")
    n_tokens = rows.numel()
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)

    def bare():
        with torch.inference_mode():
            for batch in rows.split(args.batch_size):
                model(batch.to(device), stop_at_layer=stop)
        sync()

    def harvested():
        shutil.rmtree(work / "out", ignore_errors=True)
        harvest(
            model,
            work / "tokens.pt",
            args.hook,
            work / "out",
            context_length=args.context_length,
            batch_size=args.batch_size,
            dtype=args.dtype,
            progress=False,
        )
        sync()

    variants = {"bare forward (stop_at_layer)": bare, "hooked harvest (to disk)": harvested}
    store = None if args.skip_sae_lens else sae_lens_store(model, rows, args)
    if store is not None:
        variants["SAELens ActivationsStore (in memory)"] = lambda: sae_lens_pass(store, args.batches, sync)
    times = measure(variants, args.repeats)
    print(
        f"\n{args.model} on {device} ({torch.get_num_threads()} threads): hook {args.hook} (stop_at_layer={stop}), "
        f"{args.batches} batches of {args.batch_size} x {args.context_length} tokens, stored as {args.dtype}"
    )
    base = n_tokens / times["bare forward (stop_at_layer)"]
    for name, t in times.items():
        rate = n_tokens / t
        print(f"  {name:38s} {rate:10.0f} tokens/s   ratio to bare forward {rate / base:5.2f}x")
    shutil.rmtree(work, ignore_errors=True)


def measure(variants: dict, repeats: int) -> dict[str, float]:
    for fn in variants.values():  # warm-up
        fn()
    times = {name: [] for name in variants}
    for _ in range(repeats):
        for name, fn in variants.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(ts) for name, ts in times.items()}


def sae_lens_store(model, rows: torch.Tensor, args):
    """An ActivationsStore over the same pre-tokenized rows, or None (with the reason) where SAELens does not run."""
    try:
        from hooked.compat import alias_transformer_lens

        alias_transformer_lens()
        import datasets
        from sae_lens.training.activations_store import ActivationsStore
    except Exception as e:  # not installed, or an incompatible version
        print(f"SAELens ActivationsStore skipped: {type(e).__name__}: {e}")
        return None
    dataset = datasets.Dataset.from_dict({"tokens": rows.tolist()})
    try:
        return ActivationsStore(
            model,
            dataset,
            streaming=False,
            hook_name=args.hook,
            hook_head_index=None,
            context_size=args.context_length,
            d_in=model.cfg.d_model,
            n_batches_in_buffer=2,
            total_training_tokens=rows.numel() * (args.repeats + 1),
            store_batch_size_prompts=args.batch_size,
            train_batch_size_tokens=4096,
            prepend_bos=True,
            normalize_activations="none",
            device=torch.device(model.cfg.device),
            dtype=args.dtype,
        )
    except Exception as e:
        print(f"SAELens ActivationsStore skipped: {type(e).__name__}: {e}")
        return None


def sae_lens_pass(store, n_batches: int, sync) -> None:
    for _ in range(n_batches):
        store.get_activations(store.get_batch_tokens()).cpu()
    sync()


if __name__ == "__main__":
    main()
