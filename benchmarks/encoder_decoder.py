"""T5 speed: `HookedEncoderDecoder` vs HuggingFace's `T5ForConditionalGeneration` (float32, CPU).

A random t5-small-shaped model (d_model 512, 6+6 layers, 8 heads, vocab 32128; no download).
It times the forward (a batch of 4 prompts of 128 tokens, 64 decoder tokens) and greedy
generation of `--new-tokens` tokens at batch 1 (hooked caches the decoder's keys and values
and the cross-attention's once, as HF), interleaving the two sides, and prints the medians
of process CPU time and the ratio hooked / HF (lower is faster). It checks both generate
the same tokens.

    python benchmarks/encoder_decoder.py [--new-tokens 32] [--repeats 5] [--threads 1]
"""

from __future__ import annotations

import statistics
import time

import torch
from _machine import apply_machine_options, machine_parser


def models():
    import transformers

    from hooked.models.hooked_encoder_decoder import HookedEncoderDecoder

    config = transformers.T5Config(
        vocab_size=32128,
        d_model=512,
        d_kv=64,
        d_ff=2048,
        num_layers=6,
        num_heads=8,
        decoder_start_token_id=0,
        eos_token_id=1,
    )
    torch.manual_seed(0)
    hf = transformers.T5ForConditionalGeneration(config).eval()
    return hf, HookedEncoderDecoder.from_pretrained("t5-small-shaped", hf_model=hf)


def cpu_seconds(fn) -> float:
    start = time.process_time()
    fn()
    return time.process_time() - start


def compare(name: str, hf_fn, hooked_fn, repeats: int) -> None:
    hf_times, hooked_times = [], []
    for i in range(repeats):  # alternate which side goes first
        pair = [(hf_times, hf_fn), (hooked_times, hooked_fn)]
        for times, fn in pair if i % 2 == 0 else pair[::-1]:
            times.append(cpu_seconds(fn))
    hf_s, hooked_s = statistics.median(hf_times), statistics.median(hooked_times)
    print(f"{name}: HF {hf_s:.3f}s, hooked {hooked_s:.3f}s, ratio hooked/HF {hooked_s / hf_s:.2f}")


def main() -> None:
    parser = machine_parser(__doc__.splitlines()[0], repeats=5, threads=1)
    parser.add_argument("--new-tokens", type=int, default=32)
    args = parser.parse_args()
    apply_machine_options(args)
    hf, model = models()
    g = torch.Generator().manual_seed(0)
    encoder, decoder = torch.randint(2, 32000, (4, 128), generator=g), torch.randint(2, 32000, (4, 64), generator=g)
    prompt = encoder[:1, :64]
    n = args.new_tokens
    with torch.inference_mode():
        hf_tokens = hf.generate(prompt, max_new_tokens=n, min_new_tokens=n, do_sample=False)
        tokens = model.generate(prompt, max_new_tokens=n, stop_at_eos=False, do_sample=False, verbose=False)
        print(f"same {n} greedy tokens: {torch.equal(hf_tokens, tokens)}")
        compare(
            "forward 4x128 -> 4x64",
            lambda: hf(input_ids=encoder, decoder_input_ids=decoder),
            lambda: model(encoder, decoder_input=decoder),
            args.repeats,
        )
        compare(
            f"generate {n} tokens, batch 1",
            lambda: hf.generate(prompt, max_new_tokens=n, min_new_tokens=n, do_sample=False),
            lambda: model.generate(prompt, max_new_tokens=n, stop_at_eos=False, do_sample=False, verbose=False),
            args.repeats,
        )


if __name__ == "__main__":
    main()
