"""`hooked serve` against hostile and careless clients, at the sizes of issue #40.

Starts `hooked serve` on a tiny 2-layer GPT-2 with a 49,152-token vocabulary (8,192 positions) in
a subprocess under `ulimit -v 6 GB` and `ulimit -n 1024`, bound to 127.0.0.1, and runs every probe
of `tests/integration/serve_abuse.py`: the 256-step IG request, the broadcasting `add`, every hook
cached at 8,192 tokens, `/inspect` of 2,000 emoji, a 1.6 GB answer, 16 finished 32 MiB requests,
16 parallel 60 MiB uploads, two unread streamed answers, 1,100 half-open connections, sweeps and
attribution past `--request-timeout 3`, the status page without a token, the tokens file checks.
Prints one row per probe: its answer, what was measured, and whether the server was alive and
answering `/health` after it. `--size test` runs the CI size (tests/integration/test_serve_abuse.py).

    python benchmarks/serve_abuse.py [--size full|test] [--only PROBE ...]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    from tests.integration.serve_abuse import PROBES, SIZES, Server, make_checkpoint, run_probe

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="full")
    parser.add_argument("--only", nargs="*", choices=sorted(PROBES), default=None)
    args = parser.parse_args()
    size = SIZES[args.size]
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = make_checkpoint(Path(tmp) / "checkpoint")
        (Path(tmp) / "server").mkdir()
        server = Server(checkpoint, size, Path(tmp) / "server")
        print(f"size {args.size}: {size}")
        print("| probe | as it should | answer | measured | alive after |\n|---|---|---|---|---|")
        failed = 0
        try:
            for name in args.only or PROBES:
                started = time.monotonic()
                finding = run_probe(server, size, name)
                numbers = ", ".join(
                    f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in finding.numbers.items()
                )
                print(f"| {finding.probe} | {finding.ok} | {finding.answer[:100]} | {numbers} | {finding.alive} "
                      f"({time.monotonic() - started:.1f} s) |", flush=True)  # fmt: skip
                failed += not (finding.ok and finding.alive)
        finally:
            server.stop()
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
