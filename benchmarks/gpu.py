"""On a CUDA GPU: `hooked` vs HuggingFace forward and greedy KV-cached generation, same model and inputs.

A random Llama with Llama-3.2-1B's shapes (d_model 2048, 16 layers, 32 query / 8 KV heads, MLP 8192;
vocabulary cut to 32k), in bfloat16, both sides on the default attention (SDPA). Times are wall-clock
with `torch.cuda.synchronize()`, the median of `--repeats` after two warm-ups, the two libraries
interleaved. Prints hooked/HF throughput ratios (> 1: hooked faster) and whether greedy tokens agree.

    python benchmarks/gpu.py [--repeats 5] [--new-tokens 128] [--layers 16]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

NO_PROCESSING = dict(fold_ln=False, center_writing_weights=False, center_unembed=False, fold_value_biases=False)


def build(layers: int):
    import transformers

    from hooked import HookedTransformer

    config = transformers.LlamaConfig(
        hidden_size=2048, intermediate_size=8192, num_hidden_layers=layers, num_attention_heads=32,
        num_key_value_heads=8, vocab_size=32000, max_position_embeddings=4096, rope_theta=500000.0,
        tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=0,
    )  # fmt: skip
    torch.manual_seed(0)
    # Built on the CPU in bf16, then moved, as from_pretrained(dtype=..., device_map="cuda") does: rotary
    # frequencies are float32 and computed by the CPU's pow (built under torch.device("cuda"), HF would use
    # the GPU's pow, one ulp off in places, and hooked, which computes them as from_pretrained, would differ)
    hf = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).to("cuda").eval()
    hf.generation_config.eos_token_id = None  # generate every token, as stop_at_eos=False does
    model = HookedTransformer.from_pretrained(
        "llama-1b-random", hf_model=hf, dtype=torch.bfloat16, device="cuda", **NO_PROCESSING
    )
    return model, hf


def timed(fn) -> tuple[float, object]:
    torch.cuda.synchronize()
    start = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    return time.perf_counter() - start, out


def compare(name: str, ours, theirs, n_items: int, repeats: int) -> dict:
    """Median seconds of each (interleaved, two warm-ups) and the throughput ratio hooked/HF."""
    for _ in range(2):
        ours(), theirs()
    t_ours, t_hf = [], []
    for i in range(repeats):
        pair = [(t_ours, ours), (t_hf, theirs)]
        for times, fn in pair if i % 2 == 0 else pair[::-1]:
            times.append(timed(fn)[0])
    row = dict(name=name, hooked_s=statistics.median(t_ours), hf_s=statistics.median(t_hf))
    row["ratio"] = row["hf_s"] / row["hooked_s"]
    print(
        f"{name:<40} hooked {n_items / row['hooked_s']:10.0f}/s   HF {n_items / row['hf_s']:10.0f}/s   "
        f"ratio {row['ratio']:.3f}",
        flush=True,
    )
    return row


def print_parity(model, hf, tokens) -> None:
    """max |Δ log_softmax| of hooked vs HF (both SDPA), beside HF's own eager-vs-SDPA gap on the same batch."""
    ours = model(tokens).double().log_softmax(-1)
    sdpa = hf(tokens).logits.double().log_softmax(-1)
    hf.set_attn_implementation("eager")
    eager = hf(tokens).logits.double().log_softmax(-1)
    hf.set_attn_implementation("sdpa")
    model.cfg.attn_implementation = "eager"
    ours_eager = model(tokens).double().log_softmax(-1)
    model.cfg.attn_implementation = "auto"
    print(
        f"parity {tuple(tokens.shape)} bf16, max |Δ log_softmax|: hooked vs HF (SDPA) {(ours - sdpa).abs().max():.1e}, "
        f"hooked vs HF (eager) {(ours_eager - eager).abs().max():.1e}, "
        f"HF eager vs HF SDPA {(eager - sdpa).abs().max():.1e}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--layers", type=int, default=16)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("benchmarks/gpu.py needs a CUDA device")
    model, hf = build(args.layers)
    print(
        f"{torch.cuda.get_device_name()}, torch {torch.__version__}, "
        f"{sum(p.numel() for p in hf.parameters()) / 1e9:.2f}B params bf16"
    )
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for batch, pos in ((1, 512), (8, 512), (32, 512)):
            tokens = torch.randint(3, 32000, (batch, pos), generator=gen).cuda()
            # the default arguments bind this iteration's tokens (compare calls the lambdas before the next one)
            compare(f"forward {batch}x{pos} (tokens/s)", lambda t=tokens: model(t), lambda t=tokens: hf(t).logits,
                    batch * pos, args.repeats)  # fmt: skip
        print_parity(model, hf, tokens)
        names = [f"blocks.{i}.hook_resid_post" for i in range(model.cfg.n_layers)]
        tokens = torch.randint(3, 32000, (8, 512), generator=gen).cuda()
        compare("run_with_cache 8x512, every resid_post", lambda: model.run_with_cache(tokens, names_filter=names),
                lambda: hf(tokens, output_hidden_states=True).hidden_states, 8 * 512, args.repeats)  # fmt: skip
        for batch in (1, 8):
            prompt = torch.randint(3, 32000, (batch, 32), generator=gen).cuda()
            mask = torch.ones_like(prompt)
            n = args.new_tokens

            def ours(prompt=prompt, n=n):
                return model.generate(prompt, max_new_tokens=n, do_sample=False, stop_at_eos=False, verbose=False)

            def theirs(prompt=prompt, mask=mask, n=n):
                return hf.generate(prompt, attention_mask=mask, max_new_tokens=n, do_sample=False, min_new_tokens=n)

            compare(f"greedy generate b{batch}, {n} new (tokens/s)", ours, theirs, batch * n, max(3, args.repeats // 2))
            same = (ours()[:, -n:] == theirs()[:, -n:]).float().mean().item()
            print(
                f"  greedy tokens equal to HF's: {same:.1%} (random weights: near-uniform logits, so any bf16 "
                "rounding difference flips ties; see the parity line)"
            )


if __name__ == "__main__":
    main()
