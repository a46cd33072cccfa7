"""What nnsight support costs a `hooked` model, side by side in one run.

A small random GPT-2-shaped model (d_model 256, 4 layers) on a short input, where Python
overhead per module call shows most. Variants, each timed once per repeat, interleaved:

- hooked forward with `HookPoint.__call__` as it was before nnsight support (no per-instance
  `forward` lookup), restored for the timing only;
- hooked forward as it is now (the unhooked fast path plus one `__dict__` lookup);
- the same model wrapped by `NNsight`, called outside any trace;
- an nnsight trace that watches nothing, and one that saves one hook point;
- HF's forward, for scale.

    python benchmarks/nnsight_overhead.py [--repeats 21] [--threads 1] [--clock cpu]
"""

from __future__ import annotations

import statistics
import time

import torch
from _machine import apply_machine_options, machine_parser

from hooked.core.hook_points import HookPoint

CLOCKS = {"cpu": time.process_time, "wall": time.perf_counter}


def call_before_nnsight(self, x):
    """`HookPoint.__call__` before nnsight support: no per-instance forward lookup."""
    if self._forward_hooks or self._forward_pre_hooks:
        return torch.nn.Module.__call__(self, x)
    if not (self._fwd_fns or self._bwd_fns):
        return x
    return self.forward(x)


def small_gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    from hooked import HookedTransformer

    torch.manual_seed(0)
    hf = GPT2LMHeadModel(GPT2Config(n_layer=4, n_embd=256, n_head=4, vocab_size=5000)).eval()
    return hf, HookedTransformer.from_pretrained_no_processing("gpt2", hf_model=hf)


def measure(variants: dict, repeats: int, clock) -> dict[str, float]:
    for fn in variants.values():  # warm-up
        fn()
    times = {name: [] for name in variants}
    for _ in range(repeats):
        for name, fn in variants.items():
            start = clock()
            fn()
            times[name].append(clock() - start)
    return {name: statistics.median(ts) for name, ts in times.items()}


def main() -> None:
    import nnsight

    parser = machine_parser(__doc__.splitlines()[0], repeats=21)
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall")
    parser.add_argument("--pos", type=int, default=16, help="tokens per forward (batch 1)")
    args = parser.parse_args()
    apply_machine_options(args)
    hf, model = small_gpt2()
    # a second copy of the weights for the NNsight-wrapped runs: wrapping installs nnsight's
    # forward on every module of the wrapped model, so the plain rows use an unwrapped one
    _, wrapped = small_gpt2()
    nm = nnsight.NNsight(wrapped)
    tokens = torch.randint(0, 5000, (1, args.pos), generator=torch.Generator().manual_seed(0))
    current = HookPoint.__call__

    def before():
        HookPoint.__call__ = call_before_nnsight
        try:
            model(tokens)
        finally:
            HookPoint.__call__ = current

    def trace_nothing():
        with nm.trace(tokens):
            pass

    def trace_one():
        with nm.trace(tokens):
            nm.blocks[2].attn.hook_pattern.output.save()

    variants = {
        "hooked forward, HookPoint before nnsight": before,
        "hooked forward, HookPoint now": lambda: model(tokens),
        "NNsight-wrapped, called outside a trace": lambda: wrapped(tokens),
        "nnsight trace, nothing watched": trace_nothing,
        "nnsight trace, saving hook_pattern": trace_one,
        "hf forward": lambda: hf(tokens),
    }
    with torch.no_grad():
        med = measure(variants, args.repeats, CLOCKS[args.clock])
    base = med["hooked forward, HookPoint before nnsight"]
    print(f"\nGPT-2-shaped (d 256, 4 layers): batch 1 x {args.pos} tokens, float32, {torch.get_num_threads()} threads")
    for name, t in med.items():
        print(f"  {name:42s} {t * 1000:8.2f} ms ({args.clock})   ratio to 'before' {t / base:5.2f}")


if __name__ == "__main__":
    main()
