"""Scaling out, both engines on a random ~0.5 B-parameter Llama checkpoint.

    python benchmarks/scale.py pipeline [args of scale_pipeline.py]   # torch.distributed, 2 gloo ranks
    python benchmarks/scale.py offload  [args of scale_offload.py]    # accelerate, max_memory = weights / 4
    python benchmarks/scale.py                                         # both, default sizes

`scale_pipeline.bench_pipeline`: peak RSS per rank of a 2-stage pipeline vs one process (goal
<= 0.6x) and the throughput of a large batch with and without micro-batching.
`scale_offload.bench_offload`: peak RSS with CPU + disk offload vs in memory (goal <= 0.5x), and
the slowdown of paging blocks in from the offload folder.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import scale_offload  # noqa: E402
import scale_pipeline  # noqa: E402


def main() -> None:
    which, rest = (sys.argv[1], sys.argv[2:]) if len(sys.argv) > 1 else ("all", [])
    runners = {"pipeline": [scale_pipeline.main], "offload": [scale_offload.main]}
    runners["all"] = runners["pipeline"] + runners["offload"]
    if which not in runners:
        raise SystemExit(f"usage: scale.py [pipeline|offload|all] [args]; got {which!r}")
    for run in runners[which]:
        sys.argv = [sys.argv[0], *rest]
        run()


if __name__ == "__main__":
    main()
