"""Greedy KV-cached generation speed: `hooked` vs HuggingFace on a bundled model (float32, CPU).

The model is SmolLM2-135M unless `--model` names another bundled one (gemma-3-270m).

For batch 1 and a left-padded batch of 4, without hooks and with one no-op hook per
layer (`blocks.{l}.hook_resid_post`), it times `model.generate` and HF's `generate`
(default attention, SDPA) for the same tokens and mask, interleaving the two (alternating
which goes first) so that machine load affects both alike, and prints medians and the ratio
hooked tokens/s / HF tokens/s (targets: >= 1.0 without hooks, >= 0.9 with hooks), with
the quartiles of the per-repeat ratios to show the run-to-run spread.
Times are process CPU time (`--clock wall` for wall-clock), which is steadier on a
shared machine; with one thread they agree on an idle one. The HF baseline never has
hooks. It also checks that both produce the same tokens.

    python benchmarks/generate.py [--model smollm2-135m] [--new-tokens 64] [--repeats 5] [--threads 1] \
        [--clock cpu|wall]
"""

from __future__ import annotations

import statistics
import time

import torch
from _machine import apply_machine_options, machine_parser

PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village by the sea, there lived",
    "def fibonacci(n):",
    "Hooks let you read and rewrite every activation of a transformer, so",
]
NO_PROCESSING = dict(fold_ln=False, center_writing_weights=False, center_unembed=False, fold_value_biases=False)


def load_models(name: str = "smollm2-135m"):
    import transformers

    from hooked import HookedTransformer
    from hooked.loading.bundled import bundled_checkpoint_dir

    model = HookedTransformer.from_pretrained(name, **NO_PROCESSING)
    path = bundled_checkpoint_dir(name)
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    hf.generation_config.eos_token_id = None  # always generate every token, as stop_at_eos=False does
    return model, hf


CLOCKS = {"cpu": time.process_time, "wall": time.perf_counter}


def time_hooked(model, tokens, mask, n_new, hooks, clock) -> tuple[float, torch.Tensor]:
    start = clock()
    out = model.generate(
        tokens, max_new_tokens=n_new, attention_mask=mask, do_sample=False, stop_at_eos=False, verbose=False,
        fwd_hooks=hooks,
    )  # fmt: skip
    return clock() - start, out


def time_hf(hf, tokens, mask, n_new, pad_id, clock) -> tuple[float, torch.Tensor]:
    start = clock()
    with torch.inference_mode():
        out = hf.generate(tokens, attention_mask=mask, max_new_tokens=n_new, do_sample=False, pad_token_id=pad_id)
    return clock() - start, out


def noop(x, hook):
    return None


def main() -> None:
    parser = machine_parser(__doc__.splitlines()[0], repeats=5, threads=1)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="cpu")
    parser.add_argument("--model", default="smollm2-135m", help="bundled model name (smollm2-135m, gemma-3-270m)")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 4])
    args = parser.parse_args()
    apply_machine_options(args)
    clock = CLOCKS[args.clock]
    model, hf = load_models(args.model)
    pad_id = model.tokenizer.pad_token_id
    print(f"{args.model} fp32 CPU, {args.threads} thread(s), {args.new_tokens} new tokens, greedy, "
          f"median {args.clock} time of {args.repeats} (after one warm-up)")  # fmt: skip
    print(
        f"{'batch':>5} {'hooks':>13} {'hooked tok/s':>13} {'HF tok/s':>9} {'ratio':>6} {'pairs q1-q3':>12}  same tokens"
    )
    for batch in args.batches:
        tokens, mask = model.to_tokens(PROMPTS[:batch], padding_side="left", return_attention_mask=True)
        for hooks_label, hooks in [("none", []), ("1 no-op/layer", hook_per_layer(model))]:
            ours, theirs, same = [], [], True
            for repeat in range(args.repeats + 1):
                if repeat % 2:  # alternate who goes first, so neither gains from a warmer machine
                    t_hf, out_hf = time_hf(hf, tokens, mask, args.new_tokens, pad_id, clock)
                    t_ours, out_ours = time_hooked(model, tokens, mask, args.new_tokens, hooks, clock)
                else:
                    t_ours, out_ours = time_hooked(model, tokens, mask, args.new_tokens, hooks, clock)
                    t_hf, out_hf = time_hf(hf, tokens, mask, args.new_tokens, pad_id, clock)
                same &= torch.equal(out_ours, out_hf)
                if repeat > 0:
                    ours.append(t_ours)
                    theirs.append(t_hf)
            n = batch * args.new_tokens
            ours_rate, hf_rate = n / statistics.median(ours), n / statistics.median(theirs)
            ratio = ours_rate / hf_rate
            q1, _, q3 = pair_quartiles(ours, theirs)
            print(
                f"{batch:>5} {hooks_label:>13} {ours_rate:>13.1f} {hf_rate:>9.1f} {ratio:>6.2f} "
                f"{q1:>5.2f}-{q3:<6.2f}  {same}"
            )


def pair_quartiles(ours: list[float], theirs: list[float]) -> list[float]:
    """Quartiles of the per-repeat ratios (HF time / hooked time): how far one pair can drift."""
    return statistics.quantiles([t_hf / t_ours for t_ours, t_hf in zip(ours, theirs, strict=True)], n=4)


def hook_per_layer(model):
    return [(f"blocks.{layer}.hook_resid_post", noop) for layer in range(model.cfg.n_layers)]


if __name__ == "__main__":
    main()
