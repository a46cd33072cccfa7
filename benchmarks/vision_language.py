"""Forward with an image: hooked's `HookedVisionLanguageModel` vs HuggingFace's LLaVA, side by side in one run.

A randomly initialised LLaVA-shaped model, scaled down to run on a CPU: a CLIP ViT (d_model 512, 8 layers,
8 heads, 224-pixel images in 14-pixel patches: 256 patches and a class token; features from the
second-to-last layer, class token dropped), LLaVA's two-layer GELU projector, and a Llama language
model (d_model 512, 8 layers, 8 heads, vocabulary 32000). One prompt: BOS, a few text tokens, the
256 image tokens, a question. Float32, no grad. Each repeat times every variant once, interleaved
(the machine is shared: medians of interleaved repeats), and the script prints the ratio of each
to HF eager attention, the reference of the parity tests, with the bound (1.10x) beside it.

hooked, like HF, runs every ViT block up to the feature layer; it does not run the last block, whose
output LLaVA never reads (HF computes it and drops it): that is 1 of the ViT's 8 blocks.

    python benchmarks/vision_language.py [--repeats 7] [--threads N] [--clock cpu]
"""

from __future__ import annotations

import statistics
import time

import torch
from _machine import apply_machine_options, machine_parser

BOUND = 1.10
IMAGE_TOKEN = 31999


def llava_shaped(attn_implementation: str):
    from transformers import LlavaConfig, LlavaForConditionalGeneration

    torch.manual_seed(0)
    config = LlavaConfig(
        text_config=dict(
            model_type="llama", hidden_size=512, intermediate_size=1376, num_hidden_layers=8, num_attention_heads=8,
            vocab_size=32000, max_position_embeddings=1024,
        ),
        vision_config=dict(
            model_type="clip_vision_model", hidden_size=512, intermediate_size=2048, num_hidden_layers=8,
            num_attention_heads=8, image_size=224, patch_size=14, hidden_act="quick_gelu",
        ),
        image_token_id=IMAGE_TOKEN, vision_feature_layer=-2, vision_feature_select_strategy="default",
        attn_implementation=attn_implementation,
    )  # fmt: skip
    return LlavaForConditionalGeneration(config).eval()


CLOCKS = {"cpu": time.process_time, "wall": time.perf_counter}


def measure(variants: dict, repeats: int, clock) -> dict[str, float]:
    for fn in variants.values():  # warm-up
        fn()
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(repeats):
        for name, fn in variants.items():
            start = clock()
            fn()
            times[name].append(clock() - start)
    return {name: statistics.median(ts) for name, ts in times.items()}


def main() -> None:
    parser = machine_parser(__doc__.splitlines()[0], repeats=7)
    parser.add_argument(
        "--clock", choices=sorted(CLOCKS), default="wall", help="cpu: process CPU time (steadier on a shared machine)"
    )
    args = parser.parse_args()
    apply_machine_options(args)
    from hooked import HookedTransformer

    hf = llava_shaped("eager")
    hf_sdpa = llava_shaped("sdpa")
    hf_sdpa.load_state_dict(hf.state_dict())
    model = HookedTransformer.from_pretrained_no_processing("llava-shaped", hf_model=hf)
    tokens = torch.tensor([[1, 3148, 1001, 29901] + [IMAGE_TOKEN] * 256 + [13, 5618, 338, 297, 278, 1967, 29973]])
    pixels = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    variants = {
        "hf forward (eager attention)": lambda: hf(input_ids=tokens, pixel_values=pixels),
        "hf forward (sdpa attention)": lambda: hf_sdpa(input_ids=tokens, pixel_values=pixels),
        "hooked forward": lambda: model(tokens, pixel_values=pixels),
        "hooked run_with_cache (resid_post)": lambda: model.run_with_cache(
            tokens, pixel_values=pixels, names_filter=lambda n: n.endswith("hook_resid_post")
        ),
    }
    with torch.inference_mode():
        difference = model(tokens, pixel_values=pixels) - hf(input_ids=tokens, pixel_values=pixels).logits
        assert difference.abs().max() < 1e-4  # the same model
        med = measure(variants, args.repeats, CLOCKS[args.clock])
    base = med["hf forward (eager attention)"]
    print(
        f"LLaVA-shaped (random init): ViT d 512 x 8 layers, 257 positions; Llama d 512 x 8 layers; "
        f"{tokens.shape[1]} tokens (256 image); float32, {torch.get_num_threads()} threads, "
        f"medians of {args.repeats} interleaved repeats, {args.clock} clock"
    )
    for name, t in med.items():
        bound = f"   (bound {BOUND:.2f})" if name == "hooked forward" else ""
        print(f"  {name:36s} {t * 1000:8.1f} ms   ratio to HF eager {t / base:5.2f}{bound}")


if __name__ == "__main__":
    main()
