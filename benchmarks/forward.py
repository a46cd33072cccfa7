"""Forward-pass speed of hooked vs HuggingFace, measured side by side in one run.

Rows: a randomly initialised GPT-2-small-sized model (124M parameters), a random
Mixtral-shaped mixture of experts (8 experts, top-2, d_model 512, 4 layers), a random
Pythia-160m-sized GPT-NeoX (parallel block, partial rotary, fused QKV) and, when the
bundled model is installed, SmolLM2-135M. Batch 4 x 128 tokens, float32, CPU, no grad.
Each repeat times every variant once, interleaved, and the script prints medians and
ratios to HF's forward (HF with its default SDPA attention).

    python benchmarks/forward.py [--repeats 7] [--threads N] [--skip-smollm2] [--only-mixtral] [--only-pythia]
    python benchmarks/forward.py --model gemma-3-270m [--clock cpu]   # one bundled real model's row only
    python benchmarks/forward.py --model pythia-160m-random          # = --only-pythia
"""

from __future__ import annotations

import statistics
import time

import torch
from _machine import apply_machine_options, machine_parser

CLOCKS = {"cpu": time.process_time, "wall": time.perf_counter}
clock = CLOCKS["wall"]


def timed(fn) -> float:
    start = clock()
    fn()
    return clock() - start


def measure(variants: dict, repeats: int) -> dict[str, float]:
    for fn in variants.values():  # warm-up
        fn()
    times = {name: [] for name in variants}
    for _ in range(repeats):
        for name, fn in variants.items():
            times[name].append(timed(fn))
    return {name: statistics.median(ts) for name, ts in times.items()}


def bench(label: str, hf, model, tokens, repeats: int) -> None:
    resid_post = lambda name: name.endswith("hook_resid_post")  # noqa: E731
    variants = {
        "hf forward": lambda: hf(tokens),
        "hooked forward": lambda: model(tokens),
        "hooked run_with_cache (all hooks)": lambda: model.run_with_cache(tokens),
        "hooked run_with_cache (resid_post)": lambda: model.run_with_cache(tokens, names_filter=resid_post),
    }
    with torch.inference_mode():
        med = measure(variants, repeats)
    base = med["hf forward"]
    print(f"\n{label}: batch {tokens.shape[0]} x {tokens.shape[1]} tokens, float32, {torch.get_num_threads()} threads")
    for name, t in med.items():
        print(f"  {name:38s} {t * 1000:8.1f} ms ({clock.__name__})   ratio to HF {t / base:5.2f}")


def gpt2_small():
    from transformers import GPT2Config, GPT2LMHeadModel

    from hooked import HookedTransformer

    torch.manual_seed(0)
    hf = GPT2LMHeadModel(GPT2Config()).eval()  # 124M parameters, HF's default (SDPA) attention
    model = HookedTransformer.from_pretrained_no_processing("gpt2", hf_model=hf)
    return hf, model


def mixtral_shaped():
    from transformers import MixtralConfig, MixtralForCausalLM

    from hooked import HookedTransformer

    torch.manual_seed(0)
    config = MixtralConfig(
        hidden_size=512,
        intermediate_size=1792,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=2,
        num_local_experts=8,
        num_experts_per_tok=2,
        vocab_size=32000,
    )
    hf = MixtralForCausalLM(config).eval()  # HF's default (SDPA) attention and experts implementation
    model = HookedTransformer.from_pretrained_no_processing("mixtral-shaped", hf_model=hf)
    return hf, model


def pythia_160m():
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    from hooked import HookedTransformer

    torch.manual_seed(0)
    config = GPTNeoXConfig(  # EleutherAI/pythia-160m's shape
        hidden_size=768,
        intermediate_size=3072,
        num_hidden_layers=12,
        num_attention_heads=12,
        vocab_size=50304,
        max_position_embeddings=2048,
        use_parallel_residual=True,
        rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.25),
    )
    hf = GPTNeoXForCausalLM(config).eval()  # HF's default (SDPA) attention
    model = HookedTransformer.from_pretrained_no_processing("pythia-160m-random", hf_model=hf)
    return hf, model


def bundled(name: str = "smollm2-135m"):
    """A bundled real model (HF with its default attention, hooked unprocessed), both float32."""
    from transformers import AutoModelForCausalLM

    from hooked import HookedTransformer
    from hooked.loading.bundled import bundled_checkpoint_dir

    path = bundled_checkpoint_dir(name)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    model = HookedTransformer.from_pretrained_no_processing(name)
    return hf, model


def main() -> None:
    parser = machine_parser(__doc__.splitlines()[0], repeats=7)
    parser.add_argument("--skip-smollm2", action="store_true")
    parser.add_argument("--only-mixtral", action="store_true", help="only the mixture-of-experts row")
    parser.add_argument("--only-pythia", action="store_true", help="only the Pythia-160m-sized row")
    parser.add_argument("--model", default=None, help="only this bundled real model's row (e.g. gemma-3-270m)")
    parser.add_argument(
        "--clock",
        choices=sorted(CLOCKS),
        default="wall",
        help="cpu: process CPU time (steadier on a shared machine, 1 thread)",
    )
    args = parser.parse_args()
    apply_machine_options(args)
    global clock
    clock = CLOCKS[args.clock]
    tokens = torch.randint(0, 49152, (4, 128), generator=torch.Generator().manual_seed(0))
    if args.model:
        bench(f"{args.model} (bundled)", *bundled(args.model), tokens, args.repeats)
        return
    if args.only_pythia or args.model == "pythia-160m-random":
        bench("Pythia-160m-sized GPT-NeoX (random init)", *pythia_160m(), tokens, args.repeats)
        return
    if not args.only_mixtral:
        hf, model = gpt2_small()
        bench("GPT-2 small (random init, 124M)", hf, model, tokens, args.repeats)
        del hf, model
    hf, model = mixtral_shaped()
    bench("Mixtral-shaped MoE (random init, 8 experts top-2, d 512, 4 layers)", hf, model, tokens % 32000, args.repeats)
    del hf, model
    if args.only_mixtral:
        return
    hf, model = pythia_160m()
    bench("Pythia-160m-sized GPT-NeoX (random init)", hf, model, tokens, args.repeats)
    del hf, model
    if not args.skip_smollm2:
        try:
            hf, model = bundled("smollm2-135m")
        except (ImportError, NotImplementedError, FileNotFoundError) as err:
            print(f"\nSmolLM2 rows skipped: {err}")
            return
        bench("SmolLM2-135M-Instruct (bundled)", hf, model, tokens, args.repeats)


if __name__ == "__main__":
    main()
