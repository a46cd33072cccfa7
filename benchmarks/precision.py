"""Half precision per family: hooked vs HF in the same dtype, and both vs float32 (the table in docs/numerics.md).

For each tiny random model of `tests/tiny_models.EVERY_FAMILY` (`precision_rows`), HF loads the
saved float32 checkpoint with `from_pretrained(dtype=...)` (as users run it: rotary frequencies
stay float32) and hooked takes the same HF model unprocessed in that dtype. Each cell is the
largest |difference| of log-probabilities over a 2 x 12 token batch; δ_HF is HF's own eager vs
SDPA gap in that dtype (the yardstick for half precision: docs/numerics.md#half-precision).

    python benchmarks/precision.py [--dtypes bfloat16 float16] [--families gpt2 llama_gqa]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _cell(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1e}"


def table(rows: list[dict]) -> str:
    lines = [
        "| family | dtype | hooked vs HF | bitwise | HF eager vs SDPA (δ_HF) | HF vs fp32 | hooked vs fp32 |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['family']} | {r['dtype']} | {r['hooked_vs_hf']:.1e} | {'yes' if r['bitwise'] else 'no'} "
            f"| {_cell(r['hf_eager_vs_sdpa'])} | {r['hf_vs_fp32']:.1e} | {r['hooked_vs_fp32']:.1e} |"
        )
    return "\n".join(lines)


def main() -> None:
    from tests.helpers import precision_rows
    from tests.tiny_models import EVERY_FAMILY
    from tests.tiny_models import tokens as make_tokens

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtypes", nargs="+", default=["bfloat16", "float16"])
    parser.add_argument("--families", nargs="+", default=list(EVERY_FAMILY))
    args = parser.parse_args()
    dtypes = [getattr(torch, name) for name in args.dtypes]
    tokens = make_tokens(2, 12) % 90  # inside every tiny vocabulary
    rows = []
    for family in args.families:
        rows.extend(precision_rows(family, dtypes, tokens))
        print(table(rows[-len(dtypes) :]).splitlines()[-1], file=sys.stderr, flush=True)
    print(table(rows))


if __name__ == "__main__":
    main()
