"""`hooked serve` under load: concurrent clients on loopback, every answer checked against the local model.

A `hooked serve` subprocess hosts the model (bundled SmolLM2-135M by default); `--clients`
threads, each a different user with its own `hooked.remote` client, send `--requests` mixed
requests each (plain forward, forward with interventions, run_with_cache, greedy generation).
Every answer is compared bitwise with the same call on a local copy of the model. Prints
lost and mismatched counts, p50/p99 latency and throughput.

Then plain forwards only, side by side: the server with batching off (`--max-batch 1`, the
default) and on (`--max-batch 8`): throughput of each, and the largest |logit difference| from
the local model (batched BLAS may round differently from batch 1).

    python benchmarks/serve.py [--model smollm2-135m] [--clients 16] [--requests 25] [--threads N]
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch

from hooked import HookedTransformer, remote
from hooked import interventions as iv

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = [
    "The Eiffel Tower is in the city of",
    "When Mary and John went to the store, John gave a drink to",
    "The capital of Italy is",
    "Hooks let you read and rewrite every activation of a",
]


def requests_for(model) -> list[tuple[str, dict]]:
    """The request mix: (kind, arguments); each client cycles through it."""
    steer = torch.randn(model.cfg.d_model, generator=torch.Generator().manual_seed(0))
    mix = []
    for i, prompt in enumerate(PROMPTS):
        hooks = [
            ("blocks.3.attn.hook_z", iv.zero_ablate(heads=[i % model.cfg.n_heads])),
            (f"blocks.{i + 5}.hook_resid_post", iv.add(steer, scale=2.0, positions=[-1])),
        ]
        mix += [
            ("forward", dict(input=prompt)),
            ("hooks", dict(input=prompt, fwd_hooks=hooks)),
            ("cache", dict(input=prompt, names_filter=lambda n: n.endswith("hook_resid_post"))),
            ("generate", dict(input=prompt, max_new_tokens=4, do_sample=False, verbose=False)),
        ]
    return mix


def call(model, kind: str, kwargs: dict):
    if kind == "forward":
        return model(kwargs["input"])
    if kind == "hooks":
        return model.run_with_hooks(kwargs["input"], fwd_hooks=kwargs["fwd_hooks"])
    if kind == "cache":
        logits, cache = model.run_with_cache(kwargs["input"], names_filter=kwargs["names_filter"])
        return torch.cat([logits.flatten()] + [cache[k].flatten() for k in sorted(cache.keys())])
    kw = {k: v for k, v in kwargs.items() if k != "input"}
    return model.generate(kwargs["input"], **kw)


def same(a, b) -> bool:
    return torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b


def start_server(model: str, n_users: int, max_batch: int, threads: int | None) -> tuple[subprocess.Popen, str, dict]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    tokens = {f"user{i}": f"token-{i:04d}-benchmark-serve" for i in range(n_users)}
    env = dict(os.environ, HOOKED_SERVE_TOKENS="\n".join(f"{u} {t}" for u, t in tokens.items()))
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    cmd = [
        sys.executable,
        "-m",
        "hooked.cli",
        "serve",
        "--model",
        model,
        "--port",
        str(port),
        "--max-batch",
        str(max_batch),
        "--tokens-per-minute",
        str(10**9),
    ]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
    url = f"http://127.0.0.1:{port}"
    import httpx

    deadline = time.monotonic() + 300
    while True:
        try:
            if httpx.get(url + "/health", timeout=5).status_code == 200:
                return proc, url, tokens
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline or proc.poll() is not None:
            proc.kill()
            raise SystemExit("the server did not start")
        time.sleep(0.2)


def load(url: str, tokens: dict, mix, expected, n_requests: int) -> dict:
    """Every user sends `n_requests` requests from the mix (offset per user), all at once."""
    latencies, lost, mismatched, errors, worst = [], [0], [0], [], [0.0]
    lock = threading.Lock()

    def user(i: int, token: str):
        with remote.connect(url, token=token) as client:
            for r in range(n_requests):
                j = (i + r) % len(mix)
                start = time.perf_counter()
                try:
                    got = call(client, *mix[j])
                except Exception as e:  # noqa: BLE001 - counted as lost
                    with lock:
                        lost[0] += 1
                        errors.append(repr(e)[:200])
                    continue
                with lock:
                    latencies.append(time.perf_counter() - start)
                    mismatched[0] += not same(got, expected[j])
                    if isinstance(got, torch.Tensor) and got.is_floating_point():
                        worst[0] = max(worst[0], (got - expected[j]).abs().max().item())

    threads = [threading.Thread(target=user, args=(i, t)) for i, t in enumerate(tokens.values())]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=3600)
    wall = time.perf_counter() - start
    return dict(
        lost=lost[0], mismatched=mismatched[0], latencies=latencies, wall=wall, errors=errors[:3], worst=worst[0]
    )


def report(title: str, r: dict) -> None:
    lat = sorted(r["latencies"])
    p = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))] * 1000 if lat else float("nan")  # noqa: E731
    print(
        f"{title}: {len(lat)} answered, {r['lost']} lost, {r['mismatched']} mismatched; "
        f"p50 {p(0.5):.0f} ms, p99 {p(0.99):.0f} ms; {len(lat) / r['wall']:.1f} requests/s over {r['wall']:.1f} s; "
        f"max |logit - local| {r['worst']:.1e}"
    )
    for e in r["errors"]:
        print("   error:", e)


def forwards_side_by_side(args, local) -> None:
    mix = [("forward", dict(input=p)) for p in PROMPTS]  # equal lengths batch together; others run alone
    expected = [call(local, *m) for m in mix]
    rows = []
    for max_batch in (1, 8):
        proc, url, tokens = start_server(args.model, args.clients, max_batch, args.threads)
        try:
            r = load(url, tokens, mix, expected, args.requests)
        finally:
            proc.terminate()
            proc.wait(timeout=120)
        rows.append((max_batch, r))
    for max_batch, r in rows:
        report(f"plain forwards, --max-batch {max_batch}", r)
    rate = [len(r["latencies"]) / r["wall"] for _, r in rows]
    print(f"batching speed-up (throughput): {rate[1] / rate[0]:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--requests", type=int, default=25)
    parser.add_argument("--threads", type=int, default=None, help="torch threads of the server and the local model")
    parser.add_argument("--only-forwards", action="store_true", help="skip the mixed run")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    local = HookedTransformer.from_pretrained(args.model)
    if args.only_forwards:
        forwards_side_by_side(args, local)
        return
    mix = requests_for(local)
    expected = [call(local, *m) for m in mix]
    proc, url, tokens = start_server(args.model, args.clients, 1, args.threads)
    try:
        report(
            f"{args.clients} clients x {args.requests} mixed requests ({args.model})",
            load(url, tokens, mix, expected, args.requests),
        )
    finally:
        proc.terminate()
        proc.wait(timeout=120)
    forwards_side_by_side(args, local)


if __name__ == "__main__":
    main()
