"""Scaling out: a random ~0.5B-parameter Llama checkpoint, loaded in memory and with disk offload.

`bench_offload()`: two fresh subprocesses load the same checkpoint, one plainly and one with
`max_memory={"cpu": weights / 4}` and `offload_folder` (blocks and the unembedding paged in
from disk per forward). Each reports its peak RSS (`VmHWM`) above its RSS after a warm-up
load of one block (imports and lazy initialisation are not weights), its load time and the time of
a forward pass (no grad); the logits must agree exactly. Goal: offload
peak at most 0.5x the in-memory peak; the slowdown is what paging each block from disk costs.

    python benchmarks/scale.py [--layers 28] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: ~0.49B parameters: 28 Llama blocks of d_model 1024 (GQA 16/4 heads, d_mlp 4096), vocab 32000, untied.
SHAPE = dict(hidden_size=1024, intermediate_size=4096, num_attention_heads=16, num_key_value_heads=4, vocab_size=32000)

MAKE_CHECKPOINT = """
import json, sys, torch
from pathlib import Path
from safetensors.torch import save_file
from transformers import LlamaConfig
path, n_layers, shape = Path(sys.argv[1]), int(sys.argv[2]), json.loads(sys.argv[3])
config = LlamaConfig(num_hidden_layers=n_layers, max_position_embeddings=2048, tie_word_embeddings=False, **shape)
config.architectures = ["LlamaForCausalLM"]
config.save_pretrained(path)
d, f, v = shape["hidden_size"], shape["intermediate_size"], shape["vocab_size"]
kv = d // shape["num_attention_heads"] * shape["num_key_value_heads"]
gen = torch.Generator().manual_seed(0)
rand = lambda *s, std=0.02: (torch.randn(*s, generator=gen) * std).to(torch.bfloat16)
weight_map, shards = {}, [[None], *[[i] for i in range(n_layers)]]
for shard, layers in enumerate(shards):  # one file per block keeps this writer's memory small too
    tensors = {}
    for i in layers:
        if i is None:
            tensors = {"model.embed_tokens.weight": rand(v, d), "lm_head.weight": rand(v, d),
                       "model.norm.weight": 1 + rand(d, std=0.1)}
            continue
        p = f"model.layers.{i}."
        tensors.update({p + "self_attn.q_proj.weight": rand(d, d), p + "self_attn.k_proj.weight": rand(kv, d),
                        p + "self_attn.v_proj.weight": rand(kv, d), p + "self_attn.o_proj.weight": rand(d, d),
                        p + "mlp.gate_proj.weight": rand(f, d), p + "mlp.up_proj.weight": rand(f, d),
                        p + "mlp.down_proj.weight": rand(d, f), p + "input_layernorm.weight": 1 + rand(d, std=0.1),
                        p + "post_attention_layernorm.weight": 1 + rand(d, std=0.1)})
    name = f"model-{shard:05d}.safetensors"
    save_file(tensors, path / name, metadata={"format": "pt"})
    weight_map.update(dict.fromkeys(tensors, name))
(path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
"""

RUN = """
import gc, json, os, resource, sys, tempfile, time
import torch
from hooked import HookedTransformer
# VmHWM, not ru_maxrss: Linux carries ru_maxrss across exec, so a child of a large process
# (pytest late in a run) would report its parent's size.
peak = lambda: 1024 * int(next(l for l in open("/proc/self/status") if l.startswith("VmHWM:")).split()[1])
rss = lambda: int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
path, budget, batch, pos = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
tokens = torch.randint(0, 1000, (batch, pos), generator=torch.Generator().manual_seed(0))
options = dict(max_memory={"cpu": budget}, offload_folder=tempfile.mkdtemp()) if budget else {}
with torch.no_grad():  # warm-up: one block, the same code path, so lazy imports are not counted as weights
    HookedTransformer.from_pretrained(path, first_n_layers=1, **options)(tokens)
gc.collect()
base = rss()
start = time.perf_counter()
model = HookedTransformer.from_pretrained(path, **options)
loaded = time.perf_counter()
load_peak = peak()
times = []
with torch.no_grad():
    for _ in range(2):
        t0 = time.perf_counter()
        logits = model(tokens)
        times.append(time.perf_counter() - t0)
devices = sorted(set(getattr(model, "hf_device_map", {"": "cpu"}).values()))
print(json.dumps(dict(base=base, load_peak=load_peak - base, peak=peak() - base, load_s=loaded - start,
                      forward_s=min(times), devices=devices, logits=logits[0, -1, :8].tolist())))
"""


def make_checkpoint(path: Path, n_layers: int, shape: dict | None = None) -> Path:
    """Write a random bfloat16 Llama checkpoint (one safetensors file per block) in a subprocess."""
    path.mkdir(parents=True, exist_ok=True)
    if not (path / "model.safetensors.index.json").exists():
        _python(MAKE_CHECKPOINT, str(path), str(n_layers), json.dumps(shape or SHAPE))
    return path


def _python(code: str, *args: str) -> str:
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args], capture_output=True, text=True, cwd=ROOT, timeout=3000
    )
    if out.returncode:
        raise RuntimeError(out.stderr[-3000:])
    lines = out.stdout.strip().splitlines()
    return lines[-1] if lines else ""


def weight_bytes(n_layers: int, shape: dict | None = None) -> int:
    """float32 bytes of the model's weights (norm gains folded away do not count)."""
    shape = shape or SHAPE
    d, f, v = shape["hidden_size"], shape["intermediate_size"], shape["vocab_size"]
    kv = d // shape["num_attention_heads"] * shape["num_key_value_heads"]
    return 4 * (2 * v * d + n_layers * (2 * d * d + 2 * kv * d + 3 * d * f))


def bench_offload(checkpoint: Path, n_layers: int, batch: int = 1, pos: int = 128, shape: dict | None = None) -> dict:
    """In-memory vs disk offload at a quarter of the weights: peak RSS, load and forward time."""
    budget = weight_bytes(n_layers, shape) // 4
    plain = json.loads(_python(RUN, str(checkpoint), "0", str(batch), str(pos)))
    offload = json.loads(_python(RUN, str(checkpoint), str(budget), str(batch), str(pos)))
    if plain["logits"] != offload["logits"]:
        raise AssertionError(f"offloaded logits differ: {offload['logits']} vs {plain['logits']}")
    return dict(
        params_m=round(weight_bytes(n_layers, shape) / 4e6),
        max_memory_mib=budget >> 20,
        in_memory_peak_mib=plain["peak"] >> 20,
        offload_peak_mib=offload["peak"] >> 20,
        peak_ratio=round(offload["peak"] / plain["peak"], 3),
        in_memory_forward_s=round(plain["forward_s"], 3),
        offload_forward_s=round(offload["forward_s"], 3),
        slowdown=round(offload["forward_s"] / plain["forward_s"], 2),
        in_memory_load_s=round(plain["load_s"], 1),
        offload_load_s=round(offload["load_s"], 1),
        offload_devices=offload["devices"],
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=28)
    parser.add_argument("--keep", type=Path, help="directory for the random checkpoint (reused if present)")
    args = parser.parse_args()
    root = args.keep or Path(tempfile.mkdtemp(prefix="hooked-scale-"))
    checkpoint = make_checkpoint(root, args.layers)
    result = bench_offload(checkpoint, args.layers)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
