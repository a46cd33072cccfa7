"""How much a `kill -9` near the end of a harvest costs: tokens redone on resume, default shards vs 256 MB shards.

Runs `hooked harvest` in a subprocess, SIGKILLs it once its progress bar passes `--kill-at`, reruns the
same command and reads how many tokens the resumed run had to compute again. The old default
(one shard of about 256 MB) is run the same way, side by side:

    python benchmarks/harvest_resume_loss.py --model smollm2-135m --max-tokens 4096 --kill-at 0.8
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

OLD_SHARD_BYTES = 256 << 20


def cli(args, out: Path, batches_per_shard: int | None) -> list[str]:
    cmd = [
        sys.executable,
        "-m",
        "hooked.cli",
        "harvest",
        "--model",
        args.model,
        "--corpus",
        args.corpus,
        "--hooks",
        args.hook,
        "--out",
        str(out),
        "--context-length",
        str(args.context_length),
        "--max-tokens",
        str(args.max_tokens),
        "--batch-size",
        str(args.batch_size),
        "--no-progress",
    ]
    return cmd + ([] if batches_per_shard is None else ["--batches-per-shard", str(batches_per_shard)])


def listed_tokens(out: Path) -> int:
    path = out / "manifest.json"
    try:
        return sum(s["tokens"] for s in json.loads(path.read_text())["shards"])
    except (FileNotFoundError, json.JSONDecodeError):
        return 0


def killed_then_resumed(args, out: Path, batches_per_shard: int | None) -> dict:
    """SIGKILL the harvest once its progress bar passes `kill_at`, resume it, and return what the resume recomputed."""
    cmd = [c for c in cli(args, out, batches_per_shard) if c != "--no-progress"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    progress = [0]

    def watch() -> None:  # tqdm redraws with \r: read bytes and keep the last percentage
        text = b""
        while chunk := proc.stderr.read1(4096):
            text = (text + chunk)[-4096:]
            found = re.findall(rb"(\d+)%\|", text)
            if found:
                progress[0] = int(found[-1])

    reader = threading.Thread(target=watch, daemon=True)
    reader.start()
    start = time.monotonic()
    while proc.poll() is None and progress[0] < 100 * args.kill_at:
        if time.monotonic() - start > 3600:
            raise TimeoutError("the harvest made no progress in an hour")
        time.sleep(0.01)
    finished_first = proc.poll() is not None
    if not finished_first:
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    reader.join(timeout=10)
    kept = listed_tokens(out)
    done = subprocess.run(cli(args, out, batches_per_shard), capture_output=True, text=True, timeout=3600)
    redone = int(re.search(r"harvest: (\d+) tokens", done.stderr).group(1))
    return dict(kept=kept, redone=redone, at=progress[0], finished_before_kill=finished_first)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--corpus", default=None, help="default: a JSONL of standard-library docstrings")
    p.add_argument("--hook", default="blocks.10.hook_resid_post")
    p.add_argument("--context-length", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=4096)
    p.add_argument("--kill-at", type=float, default=0.8, help="fraction of the harvest done when killed")
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="resume-loss-"))
    if args.corpus is None:
        import inspect

        import hooked.harvest.reader as reader_module  # any long text on every machine would do

        docs = [inspect.getsource(m) for m in (inspect, argparse, json, re, subprocess, reader_module)]
        args.corpus = str(work / "corpus.jsonl")
        Path(args.corpus).write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    start = time.monotonic()
    full = subprocess.run(cli(args, work / "full", None), capture_output=True, text=True, timeout=3600)
    seconds = time.monotonic() - start
    manifest = json.loads((work / "full" / "manifest.json").read_text())
    total = sum(s["tokens"] for s in manifest["shards"])
    bps = manifest["identity"]["batches_per_shard"]
    row_bytes = sum(4 * math.prod(h["row_shape"]) for h in manifest["hooks"].values())
    old_bps = max(1, OLD_SHARD_BYTES // (row_bytes * args.context_length * args.batch_size))
    print(
        f"{total} tokens; default: {len(manifest['shards'])} shards of {bps} batches "
        f"({bps * args.batch_size * args.context_length * row_bytes / 2**20:.1f} MB); old default: "
        f"{old_bps} batches per shard (one shard here); uninterrupted run {seconds:.1f} s ({full.returncode=})"
    )
    for name, b in (("default", None), ("old 256 MB", old_bps)):
        r = killed_then_resumed(args, work / name.replace(" ", "_"), b)
        print(
            f"{name:>11}: killed at {r['at']}% with {r['kept']} tokens kept; resume recomputed {r['redone']} tokens = "
            f"{100 * r['redone'] / total:.1f}% of the harvest"
            + (" (finished before the kill)" if r["finished_before_kill"] else "")
        )


if __name__ == "__main__":
    main()
