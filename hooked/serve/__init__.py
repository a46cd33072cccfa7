"""`hooked serve`: host one model for many users, who send data (token ids, intervention specs,
metric specs, tensors), never code. See `docs/serving.md`.

    server = start_in_thread(model, tokens={"alice": "..."})   # tests, notebooks, benchmarks
    run(model, host="127.0.0.1", port=8000, tokens=...)       # what the CLI calls (blocks)

The modules, request to answer: `server` (uvicorn, shutdown) and `connections` (socket guards),
`app` (options, state, routes) and `endpoints` (one function per route), `auth` (tokens,
sessions), `pages` (HTML), `wire` (the message format) and `schema` (the request fields, shared
with `hooked.remote`), `costs` (admission by estimated memory), `ops` (validate and run each
operation), `scheduler` (fair queueing, limits, deadlines), `answers` (sending with timeouts),
`memory` (budgets and returning freed memory), `pipeline` (a model split over ranks).
"""

from __future__ import annotations

import importlib
import json
import logging
from typing import TYPE_CHECKING, Any

from hooked.core.errors import HookedError, InputError

if TYPE_CHECKING:
    from hooked.serve.app import ServeOptions, create_app
    from hooked.serve.auth import is_loopback, parse_tokens, read_tokens_file, resolve_tokens
    from hooked.serve.scheduler import SchedulerOptions
    from hooked.serve.server import BackgroundServer

# The server stack (Starlette, uvicorn) loads on first use of these names, not with the package:
# `hooked.remote` imports `hooked.serve.schema` and `hooked.serve.wire`, the message format it shares
# with the server, and a client needs neither (tests/unit/serve/test_serve_imports.py).
_LAZY = {
    "ServeOptions": "app", "create_app": "app", "is_loopback": "auth", "parse_tokens": "auth",
    "read_tokens_file": "auth", "resolve_tokens": "auth", "SchedulerOptions": "scheduler",
    "BackgroundServer": "server",
}  # fmt: skip


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    globals()[name] = value
    return value


LOG_FIELDS = (
    "request_id", "user", "method", "path", "status", "ms", "job_ids", "kind", "batch", "seconds", "drained",
    "error", "estimate",
)  # fmt: skip


class JsonLogFormatter(logging.Formatter):
    """One JSON object per line: time, level, message and the request fields (never a token)."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {"time": round(record.created, 3), "level": record.levelname, "msg": record.getMessage()}
        entry.update({k: getattr(record, k) for k in LOG_FIELDS if hasattr(record, k)})
        if record.exc_info:
            entry["error"] = self.formatException(record.exc_info).splitlines()[-1]
        return json.dumps(entry, default=str)


def start_in_thread(
    model,
    tokens: dict[str, str] | None = None,
    options: ServeOptions | None = None,
    host: str = "127.0.0.1",
    port: int = 0,
) -> BackgroundServer:
    """Serve `model` from a background thread; returns the server (its `.url`)."""
    from hooked.serve.app import create_app
    from hooked.serve.server import BackgroundServer

    return BackgroundServer(create_app(model, tokens, options), host, port)


def run(
    model,
    host: str,
    port: int,
    tokens: dict[str, str] | None,
    options: ServeOptions | None = None,
    ssl_certfile: str | None = None,
    ssl_keyfile: str | None = None,
) -> None:
    """Serve until SIGINT/SIGTERM, then finish in-flight requests (at most `options.drain_timeout_s`)."""
    from hooked.serve.app import create_app
    from hooked.serve.server import run_app

    run_app(create_app(model, tokens, options), host, port, ssl_certfile, ssl_keyfile)


__all__ = [
    "BackgroundServer",
    "HookedError",
    "InputError",
    "JsonLogFormatter",
    "SchedulerOptions",
    "ServeOptions",
    "create_app",
    "is_loopback",
    "parse_tokens",
    "read_tokens_file",
    "resolve_tokens",
    "run",
    "start_in_thread",
]
