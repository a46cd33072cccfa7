"""Peak memory and time of loading SmolLM2 with default processing, next to HF's own from_pretrained.

Each variant runs in a fresh subprocess and loads model and tokenizer. Memory is the
whole-process peak RSS (`ru_maxrss`) minus the RSS just before loading (after importing
torch and transformers' Llama modules), as a multiple of the float32 weight bytes.
HF memory-maps safetensors, so its weights become resident only when first used; the
`hf_model=` row therefore touches every HF weight first and reports our load on top of
the HF model's own (then resident) footprint.

    python benchmarks/load.py
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

VARIANTS = {
    "hf from_pretrained(path)": """
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(path)
    """,
    "hooked from_pretrained(path)": """
        model = HookedTransformer.from_pretrained("smollm2-135m")
    """,
    "hooked from_pretrained(hf_model=...)": """
        hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        sum(float(p.sum()) for p in hf.parameters())  # make the memory-mapped weights resident
        after_hf = rss()
        model = HookedTransformer.from_pretrained("smollm2-135m", hf_model=hf)
    """,
}

PRELUDE = """
import json, resource, time
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
from hooked import HookedTransformer
from hooked.loading.bundled import bundled_checkpoint_dir

def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()

def peak():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

path = bundled_checkpoint_dir("smollm2-135m")
AutoConfig.from_pretrained(path)  # import the Llama config module for every variant alike
base, after_hf = rss(), None
start = time.perf_counter()
"""

EPILOGUE = """
elapsed = time.perf_counter() - start
params = model.parameters() if hasattr(model, "parameters") else []
n = sum(p.numel() for p in {p.data_ptr(): p for p in params}.values())
print(json.dumps(dict(base=base, peak=peak(), after_hf=after_hf, seconds=elapsed, n_params=n)))
"""


def run(body: str) -> dict:
    code = PRELUDE + textwrap.dedent(body) + EPILOGUE
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    results = {name: run(body) for name, body in VARIANTS.items()}
    weight_bytes = results["hf from_pretrained(path)"]["n_params"] * 4
    print(f"SmolLM2-135M float32 weights: {weight_bytes / 2**20:.0f} MiB (model + tokenizer loaded in each row)")
    for name, r in results.items():
        extra = r["peak"] - r["base"]
        line = (
            f"  {name:38s} peak +{extra / 2**20:6.0f} MiB = {extra / weight_bytes:4.2f} x weights   "
            f"{r['seconds']:5.2f} s"
        )
        if r["after_hf"] is not None:
            hf_footprint, ours = r["after_hf"] - r["base"], r["peak"] - r["after_hf"]
            line += (
                f"\n  {'':38s} = HF model {hf_footprint / weight_bytes:4.2f} x "
                f"+ hooked {ours / weight_bytes:4.2f} x weights"
            )
        print(line)


if __name__ == "__main__":
    main()
