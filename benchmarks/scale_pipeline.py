"""Scaling out: memory per rank and throughput of the torch.distributed pipeline (`bench_pipeline`).

A random Llama-style checkpoint of about 0.5 B parameters (float32, sharded safetensors) is
written to a temporary directory once. Then, each in fresh processes:

- one process loads it with `from_pretrained` and runs one forward;
- two ranks (gloo, 127.0.0.1) load it with `pipeline=True` and run the same forward, with
  `micro_batches=1` and with `micro_batches=M`.

Memory is each process's peak RSS (`VmHWM`) minus its RSS after imports; the goal is a
per-rank peak of at most 0.6x the single process's. Throughput is tokens per second of the
forward over `--batch x --pos` tokens (best of `--repeats`).

The ranks also time the forward with and without the check-in that starts every pipelined
call (one small all-gather naming the operation, `hooked/scale/collectives.py`),
alternating the two in the same processes so machine noise hits both alike.

    python benchmarks/scale.py [--layers 32 --d-model 1024 --batch 16 --pos 64 --micro 4]
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]

RUN = r"""
import json, os, resource, sys, time
import torch
sys.path.insert(0, os.environ["HOOKED_ROOT"])
from hooked import HookedTransformer
import transformers  # noqa: F401  (imported before the baseline, as for every variant)

def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()

args = json.loads(sys.argv[1])
torch.set_num_threads(args["threads"])
base = rss()
start = time.perf_counter()
model = HookedTransformer.from_pretrained(args["path"], pipeline=args["pipeline"], **args.get("kwargs", {}))
load_s = time.perf_counter() - start
tokens = torch.randint(0, model.cfg.d_vocab, (args["batch"], args["pos"]), generator=torch.Generator().manual_seed(0))
times = {}
for micro in args["micro"]:
    best = float("inf")
    for _ in range(args["repeats"]):
        start = time.perf_counter()
        with torch.no_grad():
            model(tokens, **({"micro_batches": micro} if args["pipeline"] else {}))
        best = min(best, time.perf_counter() - start)
    times[micro] = args["batch"] * args["pos"] / best
check_in = {}
if args["pipeline"]:
    from hooked.scale import collectives

    for micro in args["micro"]:
        best = {True: float("inf"), False: float("inf")}
        for _ in range(args["repeats"]):
            for on in (True, False):
                collectives._Group.depth = 0 if on else 1  # depth > 0: calls inside another skip the check-in
                start = time.perf_counter()
                with torch.no_grad():
                    model(tokens, micro_batches=micro)
                best[on] = min(best[on], time.perf_counter() - start)
        collectives._Group.depth = 0
        check_in[micro] = {"with_s": best[True], "without_s": best[False]}
    start = time.perf_counter()
    for _ in range(200):  # the check-in alone: one all-gather of a 160-int tag
        with collectives.check_in("in forward()", model.device):
            pass
    check_in["one_call_us"] = (time.perf_counter() - start) / 200 * 1e6
# VmHWM, not ru_maxrss: ru_maxrss is kept across exec
with open("/proc/self/status") as status:
    peak = 1024 * int(next(line for line in status if line.startswith("VmHWM:")).split()[1])
print("RESULT " + json.dumps(dict(peak=peak - base, load_s=load_s, tokens_per_s=times, check_in=check_in)))
"""


def write_random_checkpoint(
    path: Path, layers: int, d_model: int, vocab: int = 32000, shard_bytes: int = 1 << 29
) -> int:
    """A random LlamaForCausalLM checkpoint, written shard by shard (never whole in memory); returns #params."""
    from safetensors.torch import save_file
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        hidden_size=d_model, intermediate_size=int(2.75 * d_model), num_hidden_layers=layers, vocab_size=vocab,
        num_attention_heads=d_model // 64, num_key_value_heads=d_model // 128, tie_word_embeddings=False,
        max_position_embeddings=2048, architectures=["LlamaForCausalLM"],
    )  # fmt: skip
    config.save_pretrained(path)
    with torch.device("meta"):
        shapes = {k: v.shape for k, v in LlamaForCausalLM(config).state_dict().items()}
    gen = torch.Generator().manual_seed(0)
    weight_map, shard, size, n_shards = {}, {}, 0, 0

    def flush():
        nonlocal shard, size, n_shards
        name = f"model-{n_shards:05d}.safetensors"
        save_file(shard, str(path / name), metadata={"format": "pt"})
        weight_map.update({k: name for k in shard})
        shard, size, n_shards = {}, 0, n_shards + 1

    for key, shape in shapes.items():
        t = torch.ones(shape) if key.endswith("norm.weight") else torch.randn(shape, generator=gen) * 0.02
        shard[key] = t
        size += t.numel() * 4
        if size >= shard_bytes:
            flush()
    if shard:
        flush()
    (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return sum(s.numel() for s in shapes.values())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(args: dict, world: int = 1) -> list[dict]:
    """Run RUN in `world` processes (a gloo world on 127.0.0.1 when > 1); each process's result."""
    port, procs = _free_port(), []
    for rank in range(world):
        env = dict(os.environ, HOOKED_ROOT=str(ROOT), PYTHONPATH=str(ROOT), CUDA_VISIBLE_DEVICES="")
        if world > 1:
            env.update(
                RANK=str(rank),
                WORLD_SIZE=str(world),
                LOCAL_RANK=str(rank),
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(port),
            )
        cmd = [sys.executable, "-c", RUN, json.dumps(args)]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    results = []
    for p in procs:
        out, err = p.communicate(timeout=3600)
        lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
        if p.returncode or not lines:
            raise RuntimeError(f"benchmark process failed ({p.returncode}):\n{err[-3000:]}")
        results.append(json.loads(lines[-1][len("RESULT ") :]))
    return results


def bench_pipeline(
    layers: int = 32, d_model: int = 1024, batch: int = 16, pos: int = 64, micro: int = 4, repeats: int = 2
):
    """Peak RSS per rank of a 2-stage pipeline vs one process, and throughput with/without micro-batching."""
    cores = os.cpu_count() or 2
    with tempfile.TemporaryDirectory() as tmp:
        n_params = write_random_checkpoint(Path(tmp), layers, d_model)
        print(f"random Llama checkpoint: {n_params / 1e9:.2f} B parameters, {n_params * 4 / 2**30:.2f} GiB float32")
        common = dict(path=tmp, batch=batch, pos=pos, repeats=repeats)
        (single,) = _run(dict(common, pipeline=False, micro=[1], threads=cores))
        ranks = _run(dict(common, pipeline=True, micro=[1, micro], threads=max(1, cores // 2)), world=2)
    gib = 2**30
    worst = max(r["peak"] for r in ranks)
    print(f"single process: peak {single['peak'] / gib:.2f} GiB, load {single['load_s']:.1f} s, "
          f"{single['tokens_per_s']['1']:.0f} tokens/s ({cores} threads)")  # fmt: skip
    for rank, r in enumerate(ranks):
        print(
            f"pipeline rank {rank}: peak {r['peak'] / gib:.2f} GiB ({r['peak'] / single['peak']:.2f}x), "
            f"load {r['load_s']:.1f} s"
        )
    print(f"pipeline worst rank / single process peak: {worst / single['peak']:.2f}x (goal <= 0.6x)")
    last = ranks[-1]["tokens_per_s"]
    print(f"pipeline (2 ranks x {max(1, cores // 2)} threads) batch {batch}x{pos}: {last['1']:.0f} tokens/s without "
          f"micro-batching, {last[str(micro)]:.0f} tokens/s with micro_batches={micro}")  # fmt: skip
    checks = dict(ranks[-1]["check_in"])
    print(f"one check-in alone: {checks.pop('one_call_us'):.0f} us (mean of 200)")
    for m, t in checks.items():
        print(f"forward with micro_batches={m}: {t['with_s'] * 1e3:.1f} ms with the call check-in, "
              f"{t['without_s'] * 1e3:.1f} ms without "
              f"({t['with_s'] / t['without_s']:.3f}x; best of {repeats})")  # fmt: skip
    return dict(single=single, ranks=ranks, ratio=worst / single["peak"])


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--d-model", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--pos", type=int, default=64)
    parser.add_argument("--micro", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=2)
    a = parser.parse_args()
    bench_pipeline(a.layers, a.d_model, a.batch, a.pos, a.micro, a.repeats)


if __name__ == "__main__":
    main()
