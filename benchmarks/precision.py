"""Half precision per family: hooked vs HF in the same dtype, and both vs float32 (the README table).

For each tiny random model of `tests/precision_models.FAMILIES`, HF loads the saved float32
checkpoint with `from_pretrained(dtype=...)` (as users run it: rotary frequencies stay
float32) and hooked loads the same HF model unprocessed in that dtype. Each cell is the
largest |difference| of log-probabilities over a 2 x 12 token batch.

    python benchmarks/precision.py [--dtypes bfloat16 float16] [--families gpt2 llama_gqa]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def compare(family: str, dtype: torch.dtype, tokens: torch.Tensor, checkpoint: Path, fp32_logprobs) -> dict:
    """Max |Δ log_softmax| of hooked vs HF in `dtype`, and of each vs float32; whether the logits are bitwise equal."""
    from transformers import AutoModelForCausalLM

    from tests.helpers import hooked_from

    hf = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=dtype, attn_implementation="eager").eval()
    ours = hooked_from(hf, dtype=dtype)
    with torch.no_grad():
        hf_logits, our_logits = hf(tokens).logits, ours(tokens)
    hf_lp, our_lp = (x.double().log_softmax(-1) for x in (hf_logits, our_logits))
    return dict(
        family=family,
        dtype=str(dtype).removeprefix("torch."),
        bitwise=bool(torch.equal(hf_logits, our_logits)),
        hooked_vs_hf=(our_lp - hf_lp).abs().max().item(),
        hf_vs_fp32=(hf_lp - fp32_logprobs).abs().max().item(),
        hooked_vs_fp32=(our_lp - fp32_logprobs).abs().max().item(),
    )


def family_rows(family: str, dtypes: list[torch.dtype], tokens: torch.Tensor) -> list[dict]:
    from tests.precision_models import FAMILIES

    hf = FAMILIES[family]()
    with torch.no_grad():
        fp32 = hf(tokens).logits.double().log_softmax(-1)
    with tempfile.TemporaryDirectory() as directory:
        hf.save_pretrained(directory)
        return [compare(family, dtype, tokens, Path(directory), fp32) for dtype in dtypes]


def table(rows: list[dict]) -> str:
    lines = [
        "| family | dtype | hooked vs HF | bitwise | HF vs fp32 | hooked vs fp32 |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['family']} | {r['dtype']} | {r['hooked_vs_hf']:.1e} | {'yes' if r['bitwise'] else 'no'} "
            f"| {r['hf_vs_fp32']:.1e} | {r['hooked_vs_fp32']:.1e} |"
        )
    return "\n".join(lines)


def main() -> None:
    from tests.acceptance.tiny_models import tokens as make_tokens
    from tests.precision_models import FAMILIES

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtypes", nargs="+", default=["bfloat16", "float16"])
    parser.add_argument("--families", nargs="+", default=list(FAMILIES))
    args = parser.parse_args()
    dtypes = [getattr(torch, name) for name in args.dtypes]
    tokens = make_tokens(2, 12) % 90  # inside every tiny vocabulary
    rows = []
    for family in args.families:
        rows.extend(family_rows(family, dtypes, tokens))
        print(table(rows[-len(dtypes) :]).splitlines()[-1], file=sys.stderr, flush=True)
    print(table(rows))


if __name__ == "__main__":
    main()
