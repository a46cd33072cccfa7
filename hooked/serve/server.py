"""Running the app: uvicorn with `hooked serve`'s connection guards and its shutdown.

`HookedServer` is uvicorn's server with one change at shutdown: the scheduler stops admitting
at once, what is queued or running goes on for the grace period (`drain_timeout_s`), and
whatever is still unfinished then is stopped and answered with a 503 ("the server is shutting
down"), logged by id, so every client gets an answer and the last log line says whether
anything was cut (`"drained": false`). uvicorn's own grace period is longer by
`ANSWER_GRACE_S`, the time those last answers get to be sent.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import uvicorn

from hooked.core.errors import HookedError, InputError
from hooked.serve.auth import is_loopback
from hooked.serve.connections import protocol_for

#: After the grace period, how long the answers to the jobs it stopped get to be sent.
ANSWER_GRACE_S = 10.0


class HookedServer(uvicorn.Server):
    """uvicorn's server, draining `hooked serve`'s scheduler within its grace period at shutdown."""

    def __init__(self, config: uvicorn.Config, app):
        super().__init__(config)
        self.serve_state = app.state.serve

    async def shutdown(self, sockets=None) -> None:
        scheduler = self.serve_state.scheduler
        scheduler.begin_shutdown()
        loop = asyncio.get_running_loop()
        timer = loop.call_later(self.serve_state.options.drain_timeout_s, scheduler.stop_unfinished)
        try:
            await super().shutdown(sockets)
        finally:
            timer.cancel()


def server_config(app, host: str, port: int, ssl_certfile: str | None = None, ssl_keyfile: str | None = None):
    """uvicorn's config for `app`: h11 with the connection guards, its limits, no log configuration of its own."""
    options = app.state.serve.options
    limits = options.connections
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        http=protocol_for(limits),
        log_level="warning",
        log_config=None,  # the loggers are the caller's (the CLI logs JSON lines)
        access_log=False,
        limit_concurrency=limits.connections + 1,  # (the guards already keep connections within the cap)
        timeout_keep_alive=max(1, int(limits.keep_alive_s)),
        timeout_graceful_shutdown=int(options.drain_timeout_s + ANSWER_GRACE_S),
        ssl_certfile=ssl_certfile,
        ssl_keyfile=ssl_keyfile,
    )


class BackgroundServer:
    """A uvicorn server on a thread (tests, notebooks, benchmarks); `stop()` drains and joins it."""

    def __init__(self, app, host: str, port: int):
        if not is_loopback(host) and not app.state.auth.enabled:
            raise InputError(f"refusing to serve on {host} without tokens")
        if port == 0:
            with socket.socket() as s:
                s.bind((host, 0))
                port = s.getsockname()[1]
        self.server = HookedServer(server_config(app, host, port), app)
        self.app, self.url = app, f"http://{host}:{port}"
        self.thread = threading.Thread(target=self.server.run, name="hooked-serve-http", daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise HookedError(f"the server on {self.url} did not start within 30 s")
            time.sleep(0.02)

    def stop(self, timeout_s: float | None = None) -> None:
        options = self.app.state.serve.options
        self.server.should_exit = True
        self.thread.join(timeout=timeout_s or options.drain_timeout_s + 2 * ANSWER_GRACE_S)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def run_app(app, host: str, port: int, ssl_certfile: str | None = None, ssl_keyfile: str | None = None) -> None:
    """Serve `app` until SIGINT/SIGTERM, then drain it (see `HookedServer`)."""
    HookedServer(server_config(app, host, port, ssl_certfile, ssl_keyfile), app).run()


__all__ = ["ANSWER_GRACE_S", "BackgroundServer", "HookedServer", "run_app", "server_config"]
