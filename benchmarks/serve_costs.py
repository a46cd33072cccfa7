"""`hooked serve`'s admission estimate of every operation against the memory it really took.

For each operation of `tests/integration/serve_costs.py`, the server subprocess is warmed up
with the request once, its freed memory handed back and its peak resident set reset
(`/proc/<pid>/clear_refs`); the request is sent again and the peak's growth over the resident
set before is compared with the estimate the server made before running it. Prints peak /
estimate per operation: at most 1 when the estimate is the upper bound it must be. The models:
a tiny 2-layer GPT-2 with a 49,152-token vocabulary, and the bundled SmolLM2-135M.

    python benchmarks/serve_costs.py [--model tiny|smollm2-135m] [--scales 1 4]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    from tests.integration.serve_abuse import SIZES, Server, make_checkpoint
    from tests.integration.serve_costs import CASES, measure

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny", help="'tiny' (GPT-2, 2 layers, vocabulary 49,152) or a model name")
    parser.add_argument("--scales", type=int, nargs="+", default=[1, 4], help="request sizes (x tokens)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = make_checkpoint(Path(tmp) / "checkpoint") if args.model == "tiny" else args.model
        (Path(tmp) / "server").mkdir()
        server = Server(model, SIZES["full"], Path(tmp) / "server", "--request-timeout", "3600")
        print(f"model {args.model}; peak = growth of the server's peak resident memory (MiB)")
        print("| operation | scale | estimate | peak | peak / estimate | answer (est.) |\n|---|---|---|---|---|---|")
        worst = 0.0
        try:
            for scale in args.scales:
                for case in CASES:
                    m = measure(server, case, scale)
                    worst = max(worst, m.ratio)
                    print(f"| {m.case} | x{scale} | {m.estimate_mib:.0f} | {m.peak_mib:.0f} | {m.ratio:.2f} | "
                          f"{m.answer_mib:.1f} |", flush=True)  # fmt: skip
        finally:
            server.stop()
    print(f"largest peak / estimate: {worst:.2f} (bound: 1)")
    sys.exit(0 if worst <= 1 else 1)


if __name__ == "__main__":
    main()
