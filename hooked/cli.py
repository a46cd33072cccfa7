"""Command line: `hooked inspect "prompt" [--model NAME] [--top-k K] [--html PATH] [--debug]`, and
`hooked harvest --model M --corpus PATH --hooks NAMES --out DIR --context-length N ...` (hooked/harvest/cli.py), and
`hooked serve [--model M] [--host H] [--port P] [--tokens FILE] ...` (host a model for many users: docs/serving.md).

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
    from hooked.loading.bundled import bundled_names

    p.add_argument(
        "--model", default="smollm2-135m",
        help=f"bundled name, local checkpoint directory or .gguf file (bundled: {bundled_names()})".replace("%", "%%"),
    )  # fmt: skip
    p.add_argument("--top-k", type=int, default=10)
    p.add_argument("--answer", default=None, help="token whose logit is attributed (default: the top prediction)")
    p.add_argument("--wrong", default=None, help="attribute the logit difference answer - wrong")
    p.add_argument("--layer", type=int, default=None, help="layer of the attention view in --html (default: the "
                   "layer of the head attending most sharply from the last token)")  # fmt: skip
    p.add_argument("--device", default=None)
    p.add_argument("--html", default=None, metavar="PATH", help="also write interactive views of the prompt to PATH")
    p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show full tracebacks on errors")
    _add_harvest(sub)
    _add_serve(sub)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        return {"harvest": _harvest, "serve": _serve}.get(args.command, _inspect)(args)
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
    from hooked.analysis.inspection import format_report, inspect_prompt
    from hooked.core.errors import InputError

    if args.top_k < 1:
        raise InputError(f"--top-k must be >= 1, got {args.top_k}")
    model = HookedTransformer.from_pretrained(args.model, device=args.device)
    report = inspect_prompt(model, args.prompt, args.top_k, answer=args.answer, wrong=args.wrong)
    sys.stdout.write(format_report(report) + "\n")
    if args.html:
        from hooked.viz.report import prompt_views

        path = prompt_views(model, args.prompt, layer=args.layer, answer=args.answer, wrong=args.wrong).save(args.html)
        sys.stdout.write(f"\nInteractive views written to {path}\n")
    return 0


def _add_harvest(sub) -> None:
    from hooked.harvest.cli import add_parser

    add_parser(sub)


def _harvest(args) -> int:
    from hooked.harvest.cli import run

    return run(args)


def _size(text: str) -> int | None:
    """A byte count: `512M`, `2G`, `1.5G`, `65536` (K, M, G, T are powers of 1024); `auto` is None."""
    if text.strip().lower() == "auto":
        return None
    units = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
    text = text.strip().upper().removesuffix("B").removesuffix("I")
    scale = units.get(text[-1:], 1)
    try:
        value = float(text[:-1] if text[-1:] in units else text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size such as 512M or 2G") from None
    return int(value * scale)


def _add_serve(sub) -> None:
    p = sub.add_parser(
        "serve",
        help="host a model over HTTP for many users (hooked.remote.connect)",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description="Host a model for many users (docs/serving.md). Memory budgets marked 'auto' are shares of "
        "the memory left after loading the model: half per request, a quarter (at most 1 GiB) per answer.",
    )
    p.add_argument("--model", default="smollm2-135m", help="bundled name, local checkpoint directory or .gguf file")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (non-loopback addresses need --tokens)")
    p.add_argument("--port", type=int, default=8000, help="port to bind")
    p.add_argument(
        "--tokens", default=None, metavar="FILE",
        help="'user token' per line, tokens of 16+ characters, one per user (or env HOOKED_SERVE_TOKENS)",
    )  # fmt: skip
    p.add_argument("--no-auth", action="store_true", help="loopback only: accept requests without a token")
    p.add_argument("--device", default=None, help="device of the model (None: the CPU)")
    p.add_argument("--ssl-certfile", default=None, help="serve HTTPS with this certificate (uvicorn's option)")
    p.add_argument("--ssl-keyfile", default=None, help="the certificate's private key")
    _add_serve_limits(p)
    p.add_argument(
        "--pipeline",
        action="store_true",
        help="under torchrun: split the model over the ranks; rank 0 answers HTTP, every rank runs each request",
    )
    p.add_argument(
        "--debug", action="store_true", default=argparse.SUPPRESS, help="show full tracebacks on errors (default: off)"
    )


def _add_serve_limits(p) -> None:
    p.add_argument("--max-tokens-per-request", type=int, default=8192, help="prompt + generated tokens per request")
    p.add_argument("--tokens-per-minute", type=int, default=200_000, help="per user")
    p.add_argument("--max-body-mb", type=float, default=64.0, help="request body size")
    p.add_argument("--max-request-memory", type=_size, default="auto", help="memory one request may use")
    p.add_argument("--max-answer-bytes", type=_size, default="auto", help="size of one answer")
    p.add_argument("--request-timeout", type=float, default=120.0, help="seconds a request may queue and run")
    p.add_argument("--max-batch", type=int, default=1, help="batch compatible forwards of different users (1: never)")
    p.add_argument("--max-connections", type=int, default=0, help="open connections (0: 1024, below the file limit)")
    p.add_argument("--max-connections-per-client", type=int, default=32, help="open connections per client address")
    p.add_argument("--header-timeout", type=float, default=10.0, help="seconds to send a request head")
    p.add_argument("--body-timeout", type=float, default=60.0, help="seconds to send a request body")
    p.add_argument("--send-timeout", type=float, default=30.0, help="seconds for a client to read each answer slice")
    p.add_argument("--drain-timeout", type=float, default=30.0, help="seconds to finish work on SIGTERM")


def _serve_options(args):
    from hooked.serve import SchedulerOptions, ServeOptions
    from hooked.serve.connections import ConnectionLimits
    from hooked.serve.ops import ServeLimits
    from hooked.serve.wire import Limits

    return ServeOptions(
        scheduler=SchedulerOptions(
            tokens_per_minute=args.tokens_per_minute, request_timeout_s=args.request_timeout, max_batch=args.max_batch
        ),
        limits=ServeLimits(
            max_tokens_per_request=args.max_tokens_per_request,
            max_request_memory=args.max_request_memory,
            max_answer_bytes=args.max_answer_bytes,
        ),
        wire=Limits(max_body_bytes=int(args.max_body_mb * 2**20)),
        connections=ConnectionLimits(
            max_connections=args.max_connections,
            max_per_client=args.max_connections_per_client,
            header_timeout_s=args.header_timeout,
            body_timeout_s=args.body_timeout,
            send_timeout_s=args.send_timeout,
        ),  # fmt: skip
        drain_timeout_s=args.drain_timeout,
    )


def _serve_logging() -> None:
    """JSON lines on stderr for hooked serve's log and uvicorn's (no plain-text tracebacks)."""
    from hooked.serve import JsonLogFormatter

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonLogFormatter())
    for name, level in (("hooked.serve", logging.INFO), ("uvicorn", logging.WARNING)):
        log = logging.getLogger(name)
        log.handlers = [handler]
        log.propagate = False
        log.setLevel(level)


def _serve(args) -> int:
    import os

    from hooked import HookedTransformer
    from hooked.serve import parse_tokens, read_tokens_file, resolve_tokens, run

    _serve_logging()
    tokens = read_tokens_file(args.tokens) if args.tokens else parse_tokens(os.environ.get("HOOKED_SERVE_TOKENS", ""))
    tokens, generated = resolve_tokens(args.host, tokens, args.no_auth)
    options = _serve_options(args)
    if args.pipeline:
        model = HookedTransformer.from_pretrained(args.model, pipeline=True)
        if model.rank != 0:
            from hooked.serve.pipeline import follow

            follow(model, options)
            return 0
    else:
        model = HookedTransformer.from_pretrained(args.model, device=args.device)
    scheme = "https" if args.ssl_certfile else "http"
    url = f"{scheme}://{args.host}:{args.port}"
    sys.stdout.write(f"Serving {args.model} on {url} ({len(tokens or {})} users)\n")
    if generated:
        sys.stdout.write(f"Connect with: hooked.remote.connect({url!r}, token={generated!r})\n")
    sys.stdout.flush()
    if args.pipeline:
        from hooked.serve.pipeline import serve_pipeline

        serve_pipeline(model, args.host, args.port, tokens, options, args.ssl_certfile, args.ssl_keyfile)
    else:
        run(model, args.host, args.port, tokens, options, args.ssl_certfile, args.ssl_keyfile)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
