"""Command line: `hooked inspect "prompt" [--model NAME] [--top-k K]`."""

from __future__ import annotations

import argparse
import logging
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hooked", description="Inspect a language model with hooks.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("inspect", help="top predictions, logit lens, attention and logit attribution for a prompt")
    p.add_argument("prompt")
    p.add_argument("--model", default="smollm2-135m", help="bundled name, local checkpoint directory or .gguf file")
    p.add_argument("--top-k", type=int, default=10)
    p.add_argument("--device", default=None)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    from hooked import HookedTransformer
    from hooked.inspection import format_report, inspect_prompt

    model = HookedTransformer.from_pretrained(args.model, device=args.device)
    sys.stdout.write(format_report(inspect_prompt(model, args.prompt, args.top_k)) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
