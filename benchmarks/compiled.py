"""Compiled vs eager, hooked vs HuggingFace, against the memory-bandwidth bound, in one run.

For forward passes (batch x 512 tokens, batch 1, 8, 32) and greedy decoding (batch 1, 8, 32)
it times, side by side and interleaved: hooked eager; hooked compiled (`model.compile()`
for the forward, `generate(cache_implementation="static", compile=True)` for decoding);
HF eager; HF with a static cache and `torch.compile`; and the bandwidth bound: the time to
read every weight once at the device's measured copy bandwidth (a decode step cannot be
faster; a long forward is compute-bound instead). Hooked rows are repeated with a steering
hook (`AddVector` on the middle layer's `hook_resid_post`, every step) and with a cache of
every `hook_resid_post` (HF has neither). Prints milliseconds (decode: per generated
token) and the ratio to HF eager.

    python benchmarks/compiled.py                 # SmolLM2-135M (bundled), the sizes above; CUDA if present
    python benchmarks/compiled.py --small         # a random 2-layer Llama, 64 tokens, batch 1 and 4: minutes on a CPU
    python benchmarks/compiled.py --device cpu --repeats 3 --new-tokens 16
"""

from __future__ import annotations

import copy
import statistics
import time

import torch
from _machine import apply_machine_options, machine_parser


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device) -> float:
    sync(device)
    start = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - start


def measure(variants: dict, repeats: int, device) -> dict[str, float]:
    """Median seconds per variant; each repeat runs every variant once, interleaved (after 2 warm-ups)."""
    for fn in variants.values():
        fn()
        fn()
    times = {name: [] for name in variants}
    for _ in range(repeats):
        for name, fn in variants.items():
            times[name].append(timed(fn, device))
    return {name: statistics.median(ts) for name, ts in times.items()}


def copy_bandwidth(device: torch.device) -> float:
    """Bytes per second of a large device-to-device copy (read + write counted)."""
    n = 64 * 2**20  # 256 MiB of float32
    src, dst = torch.randn(n, device=device), torch.empty(n, device=device)
    seconds = min(timed(lambda: dst.copy_(src), device) for _ in range(5))
    return 2 * src.numel() * src.element_size() / seconds


def weight_bytes(model) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


# -- models -----------------------------------------------------------------------------------
def small_models():
    from transformers import LlamaConfig, LlamaForCausalLM

    from hooked import HookedTransformer

    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=256, intermediate_size=768, num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=4,
        vocab_size=8192, max_position_embeddings=1024,
    )  # fmt: skip
    hf = LlamaForCausalLM(config).eval()
    return hf, HookedTransformer.from_pretrained_no_processing("llama-small-random", hf_model=hf)


def bundled_models(name: str):
    from transformers import AutoModelForCausalLM

    from hooked import HookedTransformer
    from hooked.loading.bundled import bundled_checkpoint_dir

    hf = AutoModelForCausalLM.from_pretrained(bundled_checkpoint_dir(name), dtype=torch.float32).eval()
    return hf, HookedTransformer.from_pretrained_no_processing(name)


# -- what is timed ---------------------------------------------------------------------------------
def steering_hooks(model) -> list:
    """One declarative steering hook on the middle layer's residual stream (the same object every call)."""
    from hooked.generation.static_cache import AddVector

    vector = torch.randn(model.cfg.d_model, generator=torch.Generator().manual_seed(1)).to(model.cfg.device)
    return [(f"blocks.{model.cfg.n_layers // 2}.hook_resid_post", AddVector(vector, 4.0))]


def forward_variants(model, compiled, hf, hf_compiled, tokens, steer) -> dict:
    resid = lambda name: name.endswith("hook_resid_post")  # noqa: E731
    return {
        "hooked eager": lambda: model(tokens),
        "hooked compiled": lambda: compiled(tokens),
        "hooked eager + steer": lambda: model.run_with_hooks(tokens, fwd_hooks=steer),
        "hooked compiled + steer": lambda: compiled.run_with_hooks(tokens, fwd_hooks=steer),
        "hooked eager + cache resid_post": lambda: model.run_with_cache(tokens, names_filter=resid),
        "hooked compiled + cache resid_post": lambda: compiled.run_with_cache(tokens, names_filter=resid),
        "HF eager": lambda: hf(tokens),
        "HF compiled": lambda: hf_compiled(tokens),
    }


def decode_variants(model, hf, tokens, n_new, steer, static_options) -> dict:
    resid = lambda name: name.endswith("hook_resid_post")  # noqa: E731
    common = dict(max_new_tokens=n_new, do_sample=False, stop_at_eos=False, verbose=False)
    static = dict(cache_implementation="static", compile=True, static_options=static_options)
    mask = torch.ones_like(tokens)

    def hf_generate(**kw):
        return hf.generate(
            tokens, attention_mask=mask, max_new_tokens=n_new, min_new_tokens=n_new, do_sample=False, **kw
        )

    from transformers import CompileConfig

    compile_config = CompileConfig()
    compile_config._compile_all_devices = True  # HF compiles its static-cache forward on CUDA only, unless told

    return {
        "hooked eager": lambda: model.generate(tokens, **common),
        "hooked compiled (static)": lambda: model.generate(tokens, **common, **static),
        "hooked eager + steer": lambda: model.generate(tokens, fwd_hooks=steer, **common),
        "hooked compiled + steer": lambda: model.generate(tokens, fwd_hooks=steer, **common, **static),
        "hooked eager + cache resid_post": lambda: model.generate(
            tokens, return_cache=True, names_filter=resid, **common
        ),
        "hooked compiled + cache resid_post": lambda: model.generate(
            tokens, return_cache=True, names_filter=resid, **common, **static
        ),
        "HF eager": lambda: hf_generate(),
        "HF static + compile": lambda: hf_generate(cache_implementation="static", compile_config=compile_config),
    }


def report(title: str, med: dict[str, float], bound: float, per: int = 1) -> None:
    base = med["HF eager"]
    print(f"\n{title}")
    for name, seconds in med.items():
        print(f"  {name:36s} {seconds / per * 1000:9.2f} ms   ratio to HF eager {seconds / base:5.2f}")
    print(
        f"  {'bandwidth bound (weights once)':36s} {bound * 1000:9.2f} ms   ratio to HF eager {bound * per / base:5.2f}"
    )


def main() -> None:
    parser = machine_parser(__doc__.splitlines()[0], repeats=5)
    parser.add_argument("--small", action="store_true", help="a random 2-layer Llama and small sizes (CPU: minutes)")
    parser.add_argument("--model", default="smollm2-135m", help="bundled model (without --small)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--new-tokens", type=int, default=None, help="tokens per decode (default 32; --small 16)")
    parser.add_argument(
        "--batches", type=int, nargs="+", default=None, help="batch sizes (default 1 8 32; --small 1 4)"
    )
    args = parser.parse_args()
    apply_machine_options(args)
    torch._dynamo.config.recompile_limit = 64  # every shape and hook set below is its own graph
    device = torch.device(args.device)
    hf, model = small_models() if args.small else bundled_models(args.model)
    hf, model = hf.to(device), model.to(device)
    hf.generation_config.eos_token_id = None
    hf.generation_config.pad_token_id = 0
    compiled = copy.deepcopy(model)
    compiled.compile()  # model.compile(): run_with_cache and run_with_hooks go through the compiled forward
    hf_compiled = torch.compile(hf)
    from hooked.generation.static_cache import StaticCacheOptions

    static_options = StaticCacheOptions()
    seq, batches = (64, [1, 4]) if args.small else (512, [1, 8, 32])
    batches = args.batches or batches
    n_new = args.new_tokens or (16 if args.small else 32)
    bandwidth = copy_bandwidth(device)
    bound = weight_bytes(model) / bandwidth
    print(
        f"{'small random Llama' if args.small else args.model}: {weight_bytes(model) / 2**20:.0f} MiB of float32 "
        f"weights; {device}, {torch.get_num_threads()} threads; copy bandwidth {bandwidth / 1e9:.1f} GB/s; "
        f"torch {torch.__version__}"
    )
    steer = steering_hooks(model)
    generator = torch.Generator().manual_seed(0)
    vocab = min(model.cfg.d_vocab, hf.config.vocab_size)
    with torch.inference_mode():
        for batch in batches:
            tokens = torch.randint(3, vocab, (batch, seq), generator=generator).to(device)
            med = measure(forward_variants(model, compiled, hf, hf_compiled, tokens, steer), args.repeats, device)
            report(f"forward {batch}x{seq}", med, bound)
    for batch in batches:
        tokens = torch.randint(3, vocab, (batch, 16), generator=generator).to(device)
        med = measure(decode_variants(model, hf, tokens, n_new, steer, static_options), args.repeats, device)
        report(f"greedy decode, batch {batch}, 16-token prompt, {n_new} new tokens (ms per token)", med, bound, n_new)


if __name__ == "__main__":
    main()
