"""Connections: no client can hold the server's sockets to lock the others out.

uvicorn's h11 protocol, with what it lacks for a server on a shared network:

- a header timeout: a connection that has not sent a complete request head within
  `header_timeout_s` of opening (or of its previous answer) is closed;
- a cap on open connections, global (`max_connections`, below the process's file limit) and
  per client address (`max_per_client`). When a new connection would exceed a cap, the
  oldest connection of that scope still waiting for its request head is closed to make room
  (half-open connections cost their sender nothing, so they never lock out a client that
  sends its request); if every connection is busy with a request, the new one gets a 503;
- a way for a response to drop its connection (`hooked.serve.answers.ABORT`): an answer the
  client stops reading is not kept in memory.

The body's own timeout is the application's (`hooked.serve.endpoints.read_body`).
"""

from __future__ import annotations

import json
import logging
import resource
import time
from dataclasses import dataclass

from uvicorn.protocols.http.h11_impl import H11Protocol

from hooked.serve.answers import ABORT

logger = logging.getLogger("hooked.serve")
#: File descriptors kept free for the listening socket, the model's files and logs.
RESERVED_FILES = 64


def default_max_connections() -> int:
    """Open connections the server allows: at most 1024, and `RESERVED_FILES` below the file limit."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    limit = 1024 if soft == resource.RLIM_INFINITY else soft - RESERVED_FILES
    return max(16, min(1024, limit))


@dataclass(frozen=True)
class ConnectionLimits:
    """What one server allows its connections (`hooked serve` options set them)."""

    max_connections: int = 0  # 0: `default_max_connections()`
    max_per_client: int = 32  # open connections from one client address
    header_timeout_s: float = 10.0  # to send a complete request head
    body_timeout_s: float = 60.0  # to send the whole body (enforced by the application)
    keep_alive_s: float = 5.0  # an idle connection between requests
    send_timeout_s: float = 30.0  # for the client to take each slice of an answer

    @property
    def connections(self) -> int:
        return self.max_connections or default_max_connections()


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a header timeout, connection caps and an abort extension."""

    limits: ConnectionLimits = ConnectionLimits()

    def connection_made(self, transport) -> None:  # type: ignore[override]  # (as uvicorn's own)
        super().connection_made(transport)
        self.opened = time.monotonic()
        self.served = 0  # requests whose head arrived on this connection
        self.header_timer = None
        if not self._make_room():
            self._refuse()
            return
        self._arm_header_timer()

    def data_received(self, data: bytes) -> None:
        if self._waiting_for_head():
            self._arm_header_timer()
        seen = self.cycle
        super().data_received(data)
        if self.cycle is not None and self.cycle is not seen:  # a request head arrived
            self.served += 1
            if self.header_timer is not None:
                self.header_timer.cancel()
                self.header_timer = None
            self.cycle.scope.setdefault("extensions", {})[ABORT] = self.transport.abort  # type: ignore[typeddict-item]

    def connection_lost(self, exc) -> None:
        timer = getattr(self, "header_timer", None)
        if timer is not None:
            timer.cancel()
        super().connection_lost(exc)

    # -- the header timeout ------------------------------------------------------------------
    def _waiting_for_head(self) -> bool:
        return self.cycle is None or self.cycle.response_complete

    def _arm_header_timer(self) -> None:
        if self.header_timer is None:
            self.header_timer = self.loop.call_later(self.limits.header_timeout_s, self._header_timeout)

    def _header_timeout(self) -> None:
        self.header_timer = None
        if self._waiting_for_head() and not self.transport.is_closing():
            self.transport.abort()

    # -- the caps ----------------------------------------------------------------------------
    def _open(self, host: str | None = None) -> list[GuardedH11Protocol]:
        """The other open connections (from `host` only, when given)."""
        return [
            c
            for c in self.connections
            if c is not self
            and not c.transport.is_closing()
            and (host is None or (getattr(c, "client", None) or ("",))[0] == host)
        ]

    def _make_room(self) -> bool:
        """Close the oldest waiting connection of a full scope (all, then this address); False if none waits."""
        host = self.client[0] if self.client else ""
        for scope_host, cap in ((None, self.limits.connections), (host, self.limits.max_per_client)):
            others = self._open(scope_host)
            if len(others) < cap:
                continue
            waiting = [c for c in others if isinstance(c, GuardedH11Protocol) and c._waiting_for_head()]
            if not waiting:
                return False
            oldest = min(waiting, key=lambda c: (c.served > 0, c.opened))  # never-used connections go first
            oldest.transport.abort()
        return True

    def _refuse(self) -> None:
        body = json.dumps({"error": "the server has no free connection: every one is busy with a request; retry"})
        head = f"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: {len(body)}"
        self.transport.write(f"{head}\r\nconnection: close\r\n\r\n{body}".encode())
        self.transport.close()
        logger.warning("connection refused", extra={"path": self.client[0] if self.client else "-"})


def protocol_for(limits: ConnectionLimits) -> type[GuardedH11Protocol]:
    """The protocol class uvicorn builds for each connection of a server with these limits."""
    return type("GuardedH11Protocol", (GuardedH11Protocol,), {"limits": limits})


__all__ = ["ConnectionLimits", "GuardedH11Protocol", "default_max_connections", "protocol_for"]
