"""State-space and hybrid models: `hooked` vs HuggingFace's PyTorch path, on random models of real shapes (CPU).

Two models, built from a config with random weights (nothing downloaded):

- `mamba2-130m`: Mamba-2's 130M shape (d_model 768, 24 layers, 24 heads of 64, state 128, chunk 256);
- `qwen3-next`: Qwen3-Next's layout at half its width (d_model 1024, 8 layers: three gated DeltaNet
  layers to one gated attention layer; its head sizes: attention heads of 256, DeltaNet heads of 128;
  32 experts of 256, 8 per token, and a shared expert).

HF runs its PyTorch fallback (no `mamba_ssm`, `causal_conv1d` or `flash-linear-attention` installed),
with its default attention (SDPA). Both sides are timed in one run, interleaved (alternating which goes
first, so machine load affects both alike), and the script prints medians and ratios with the bound
beside each:

- forward (`[1, length]` tokens, logits): hooked time / HF time, bound <= 1.0;
- greedy decode (a prompt, then `--new-tokens` one token per step): hooked tokens/s / HF tokens/s,
  bound >= 1.0;
- observing the state: the forward with `run_with_cache` of the last recurrent layer's `hook_ssm_state`,
  and with an editing hook on it, over the plain forward (no bound: the cost of materialising
  `[pos, heads, d_head, d_state]` for one layer, reported; it adds up per observed layer);
- memory: the peak resident memory a forward adds, at several lengths, each in a fresh process; it
  grows linearly with the length when the state is not observed.

Times are process CPU time (`--clock wall` for wall-clock), steadier on a shared machine.

    python benchmarks/ssm.py [--model mamba2-130m qwen3-next] [--length 512] [--new-tokens 32] [--repeats 5]
        [--threads 1] [--memory-lengths 256 512 1024 2048]
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time

import torch
from _machine import apply_machine_options, machine_parser

CLOCKS = {"cpu": time.process_time, "wall": time.perf_counter}
VOCAB = 32000

MODELS = {
    "mamba2-130m": (
        "Mamba2Config", "Mamba2ForCausalLM",
        dict(hidden_size=768, num_hidden_layers=24, num_heads=24, head_dim=64, state_size=128, n_groups=1,
             expand=2, chunk_size=256, vocab_size=VOCAB),
    ),
    "qwen3-next": (
        "Qwen3NextConfig", "Qwen3NextForCausalLM",
        dict(hidden_size=1024, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=2, head_dim=256,
             linear_num_key_heads=8, linear_num_value_heads=16, linear_key_head_dim=128, linear_value_head_dim=128,
             num_experts=32, num_experts_per_tok=8, moe_intermediate_size=256, shared_expert_intermediate_size=256,
             vocab_size=VOCAB, layer_types=["linear_attention"] * 3 + ["full_attention"] + ["linear_attention"] * 3
             + ["full_attention"]),
    ),
}  # fmt: skip


def build(name: str, **changes):
    """`(hooked model, HF model)`: random HF weights (seed 0), converted without processing."""
    import transformers

    from hooked import HookedTransformer

    config_cls, model_cls, kwargs = MODELS[name]
    torch.manual_seed(0)
    hf = getattr(transformers, model_cls)(getattr(transformers, config_cls)(**{**kwargs, **changes})).eval()
    hf.generation_config.eos_token_id = None
    model = HookedTransformer.from_pretrained_no_processing(name, hf_model=hf)
    return model, hf


def interleaved(runs: dict, repeats: int, clock) -> dict[str, list[float]]:
    """Each callable of `runs` timed `repeats` times, the order rotating every repeat."""
    times: dict[str, list[float]] = {key: [] for key in runs}
    keys = list(runs)
    for r in range(repeats):
        for key in keys[r % len(keys) :] + keys[: r % len(keys)]:
            start = clock()
            runs[key]()
            times[key].append(clock() - start)
    return times


def ratio_line(what: str, ours: list[float], theirs: list[float], bound: str, invert: bool = False) -> str:
    ratios = sorted((t / o if invert else o / t) for o, t in zip(ours, theirs, strict=True))
    q1, q3 = ratios[len(ratios) // 4], ratios[(3 * len(ratios)) // 4]
    med = statistics.median(ratios)
    return (
        f"  {what:<34} hooked {statistics.median(ours):7.3f}s  HF {statistics.median(theirs):7.3f}s  "
        f"ratio {med:5.2f} (quartiles {q1:.2f}-{q3:.2f})  bound {bound}"
    )


def forward_and_state(model, hf, length: int, repeats: int, clock) -> list[str]:
    tokens = torch.randint(0, VOCAB, (1, length), generator=torch.Generator().manual_seed(1))
    last = f"blocks.{model.cfg.recurrent_layers[-1]}.mixer.hook_ssm_state"

    def edit(state, hook):
        state[:, length // 2] *= 0.5  # in place: the edited path (the state read back from the hook)

    with torch.inference_mode():
        runs = {
            "hooked": lambda: model(tokens),
            "hf": lambda: hf(tokens).logits,
            "cached": lambda: model.run_with_cache(tokens, names_filter=[last]),
            "edited": lambda: model.run_with_hooks(tokens, fwd_hooks=[(last, edit)]),
        }
        times = interleaved(runs, repeats, clock)
        diff = (model(tokens) - hf(tokens).logits).abs().max().item()
    plain = statistics.median(times["hooked"])
    cached, edited = statistics.median(times["cached"]) / plain, statistics.median(times["edited"]) / plain
    with torch.inference_mode():
        _, cache = model.run_with_cache(tokens, names_filter=[last])
    state_mib = cache[last].numel() * cache[last].element_size() / 2**20
    return [
        ratio_line(f"forward [1, {length}]", times["hooked"], times["hf"], "<= 1.0"),
        f"  max |logits - HF| = {diff:.2e}",
        f"  caching one layer's hook_ssm_state:   {cached:5.2f}x the plain forward ({state_mib:.0f} MiB of states)",
        f"  editing one layer's hook_ssm_state:   {edited:5.2f}x the plain forward",
    ]


def decode(model, hf, prompt: int, new_tokens: int, repeats: int, clock) -> list[str]:
    tokens = torch.randint(0, VOCAB, (1, prompt), generator=torch.Generator().manual_seed(2))
    outs = {}

    def ours():
        outs["hooked"] = model.generate(tokens, max_new_tokens=new_tokens, do_sample=False, stop_at_eos=False,
                                        verbose=False)  # fmt: skip

    def theirs():
        with torch.inference_mode():
            outs["hf"] = hf.generate(tokens, attention_mask=torch.ones_like(tokens), max_new_tokens=new_tokens,
                                     do_sample=False, pad_token_id=0)  # fmt: skip

    times = interleaved({"hooked": ours, "hf": theirs}, repeats, clock)
    same = torch.equal(outs["hooked"], outs["hf"])
    return [
        ratio_line(f"decode {new_tokens} tokens (tokens/s)", times["hooked"], times["hf"], ">= 1.0", invert=True),
        f"  same tokens as HF: {same}",
    ]


def peak_memory_mib(name: str, length: int, observe: bool) -> float:
    """The peak resident memory (MiB) one forward adds above the loaded model, in a fresh process (4 layers).

    Linux only: the peak (`VmHWM`) is reset through `/proc/self/clear_refs` after loading, so the
    memory that building the HF model took does not count.
    """
    code = f"""
import ctypes, gc, sys, torch
sys.path.insert(0, "benchmarks")
from ssm import build
def status(key):
    return int(next(line for line in open("/proc/self/status") if line.startswith(key)).split()[1]) / 1024
changes = {{"layer_types": ["linear_attention"] * 3 + ["full_attention"]}} if {name!r} == "qwen3-next" else {{}}
model, hf = build({name!r}, num_hidden_layers=4, **changes)
del hf
gc.collect()
ctypes.CDLL("libc.so.6").malloc_trim(0)
tokens = torch.randint(0, 1000, (1, {length}))
names = [f"blocks.{{model.cfg.recurrent_layers[-1]}}.mixer.hook_ssm_state"]
with torch.inference_mode():
    model(tokens[:, :8])
    before = status("VmRSS")
    open("/proc/self/clear_refs", "w").write("5")
    out = model.run_with_cache(tokens, names_filter=names) if {observe} else model(tokens)
    print(status("VmHWM") - before)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=1800)
    return float(out.stdout.strip().splitlines()[-1])


def memory_lines(name: str, lengths: list[int]) -> list[str]:
    rows = [(length, peak_memory_mib(name, length, False)) for length in lengths]
    lines = ["  peak memory a forward adds (4 layers, state not observed): " + ", ".join(
        f"{length}: {mib:.0f} MiB" for length, mib in rows
    )]  # fmt: skip
    per_pos = [mib / length for length, mib in rows]
    lines.append("  per position: " + ", ".join(f"{p * 1024:.0f} KiB" for p in per_pos) + " (flat = linear)")
    observed = peak_memory_mib(name, lengths[0], True)
    lines.append(f"  caching one layer's state at {lengths[0]}: {observed:.0f} MiB")
    return lines


def main() -> None:
    parser = machine_parser(__doc__.splitlines()[0], repeats=5, threads=1)
    parser.add_argument("--model", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="cpu")
    parser.add_argument("--memory-lengths", type=int, nargs="*", default=[512, 1024, 2048, 4096])
    args = parser.parse_args()
    apply_machine_options(args)
    clock = CLOCKS[args.clock]
    report = {}
    for name in args.model:
        model, hf = build(name)
        n_params = sum(p.numel() for p in hf.parameters()) / 1e6
        print(f"{name}: {n_params:.0f}M parameters, threads {torch.get_num_threads()}")
        lines = forward_and_state(model, hf, args.length, args.repeats, clock)
        lines += decode(model, hf, args.prompt, args.new_tokens, args.repeats, clock)
        del model, hf
        if args.memory_lengths:
            lines += memory_lines(name, args.memory_lengths)
        print("\n".join(lines), flush=True)
        report[name] = lines
    print(json.dumps({"args": vars(args)}, default=str))


if __name__ == "__main__":
    main()
