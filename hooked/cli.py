"""Command line: `hooked inspect "prompt" [--model NAME] [--top-k K] [--html PATH] [--debug]`, and
`hooked harvest --model M --corpus PATH --hooks NAMES --out DIR --context-length N ...` (hooked/harvest/cli.py).

Errors (a missing or corrupt checkpoint, a prompt longer than the context, ...) are
printed as one line, `hooked: error: <Type>: <message>`, with exit status 1; `--debug`
shows the full traceback instead.
"""

from __future__ import annotations

import argparse
import logging
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hooked", description="Inspect a language model with hooks.")
    parser.add_argument("--debug", action="store_true", help="show full tracebacks on errors")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("inspect", help="top predictions, logit lens, attention and logit attribution for a prompt")
    p.add_argument("prompt")
    p.add_argument("--model", default="smollm2-135m", help="bundled name, local checkpoint directory or .gguf file")
    p.add_argument("--top-k", type=int, default=10)
    p.add_argument("--device", default=None)
    p.add_argument("--html", default=None, metavar="PATH", help="also write interactive views of the prompt to PATH")
    p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show full tracebacks on errors")
    _add_harvest(sub)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        return _harvest(args) if args.command == "harvest" else _inspect(args)
    except KeyboardInterrupt as e:  # a harvest says what it kept and how to resume
        sys.stderr.write("hooked: interrupted" + (f": {e}" if str(e) else "") + "\n")
        return 130
    except Exception as e:  # one line for the user; --debug for the traceback
        if args.debug:
            raise
        message = " ".join(str(e).split()) or repr(e)
        sys.stderr.write(f"hooked: error: {type(e).__name__}: {message}\n")
        return 1


def _inspect(args) -> int:
    from hooked import HookedTransformer
    from hooked.errors import InputError
    from hooked.inspection import format_report, inspect_prompt

    if args.top_k < 1:
        raise InputError(f"--top-k must be >= 1, got {args.top_k}")
    model = HookedTransformer.from_pretrained(args.model, device=args.device)
    sys.stdout.write(format_report(inspect_prompt(model, args.prompt, args.top_k)) + "\n")
    if args.html:
        from hooked.viz.report import prompt_views

        path = prompt_views(model, args.prompt).save(args.html)
        sys.stdout.write(f"\nInteractive views written to {path}\n")
    return 0


def _add_harvest(sub) -> None:
    from hooked.harvest.cli import add_parser

    add_parser(sub)


def _harvest(args) -> int:
    from hooked.harvest.cli import run

    return run(args)


if __name__ == "__main__":
    raise SystemExit(main())
