"""`hooked serve`: host one model for many users, who send data (token ids, intervention specs,
metric specs, tensors), never code. See `docs/serving.md`.

    server = start_in_thread(model, tokens={"alice": "..."})   # tests, notebooks, benchmarks
    run(model, host="127.0.0.1", port=8000, tokens=...)       # what the CLI calls (blocks)
"""

from __future__ import annotations

import ipaddress
import json
import logging
import secrets
import socket
import threading
import time

from hooked.core.errors import HookedError, InputError
from hooked.serve.app import ServeOptions, create_app, parse_tokens
from hooked.serve.scheduler import SchedulerOptions

LOG_FIELDS = ("request_id", "user", "method", "path", "status", "ms", "job_ids", "kind", "batch", "seconds", "drained")


class JsonLogFormatter(logging.Formatter):
    """One JSON object per line: time, level, message and the request fields (never a token)."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {"time": round(record.created, 3), "level": record.levelname, "msg": record.getMessage()}
        entry.update({k: getattr(record, k) for k in LOG_FIELDS if hasattr(record, k)})
        if record.exc_info:
            entry["error"] = self.formatException(record.exc_info).splitlines()[-1]
        return json.dumps(entry, default=str)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def resolve_tokens(
    host: str, tokens: dict[str, str] | None, no_auth: bool = False
) -> tuple[dict[str, str] | None, str | None]:
    """The tokens to enforce, and a one-time token generated for a loopback server started without any.

    A non-loopback address needs tokens; `no_auth` is refused there too.
    """
    if tokens:
        return tokens, None
    if not is_loopback(host):
        raise InputError(
            f"refusing to serve on {host} without authentication: pass --tokens FILE (or set HOOKED_SERVE_TOKENS) "
            "with one 'user token' pair per line, or bind 127.0.0.1"
        )
    if no_auth:
        return None, None
    token = secrets.token_urlsafe(24)
    return {"local": token}, token


class BackgroundServer:
    """A uvicorn server on a thread (tests, notebooks, benchmarks); `stop()` drains and joins it."""

    def __init__(self, app, host: str, port: int, **uvicorn_kwargs):
        import uvicorn

        if not is_loopback(host) and not app.state.auth.enabled:
            raise InputError(f"refusing to serve on {host} without tokens")
        if port == 0:
            with socket.socket() as s:
                s.bind((host, 0))
                port = s.getsockname()[1]
        config = uvicorn.Config(
            app,
            host=host,
            port=port,
            log_level="warning",
            access_log=False,
            timeout_graceful_shutdown=30,
            **uvicorn_kwargs,
        )
        self.server = uvicorn.Server(config)
        self.app, self.url = app, f"http://{host}:{port}"
        self.thread = threading.Thread(target=self.server.run, name="hooked-serve-http", daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise HookedError(f"the server on {self.url} did not start within 30 s")
            time.sleep(0.02)

    def stop(self, timeout_s: float = 30.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=timeout_s)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def start_in_thread(
    model,
    tokens: dict[str, str] | None = None,
    options: ServeOptions | None = None,
    host: str = "127.0.0.1",
    port: int = 0,
) -> BackgroundServer:
    """Serve `model` from a background thread; returns the server (its `.url`)."""
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
    import uvicorn

    options = options or ServeOptions()
    app = create_app(model, tokens, options)
    uvicorn.run(
        app,
        host=host,
        port=port,
        log_level="warning",
        access_log=False,
        ssl_certfile=ssl_certfile,
        ssl_keyfile=ssl_keyfile,
        timeout_graceful_shutdown=int(options.drain_timeout_s),
    )


__all__ = [
    "BackgroundServer",
    "JsonLogFormatter",
    "SchedulerOptions",
    "ServeOptions",
    "create_app",
    "is_loopback",
    "parse_tokens",
    "resolve_tokens",
    "run",
    "start_in_thread",
]
