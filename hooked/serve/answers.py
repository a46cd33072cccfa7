"""Sending answers that a client may never read.

An answer (a safetensors message, or a stream of JSON lines ending in one) is sent a slice at
a time, each slice written only when the connection has taken the previous one, so the server
never holds more than the answer itself plus one slice. Each send must complete within the
send timeout: a client that stops reading has its connection closed and the answer's memory
released (`TimedResponse`). When the client goes away the response stops at once and says so
(`on_close(False)`), which cancels the job behind it.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Iterable, Iterator

from starlette.responses import Response

logger = logging.getLogger("hooked.serve")
#: The ASGI scope extension through which `hooked.serve.connections` lets a response drop its connection.
ABORT = "hooked.abort"


class TimedResponse(Response):
    """An ASGI response sent slice by slice, each send bounded by `send_timeout_s`.

    `chunks` (bytes, sync or async iterable) is the body. `on_close(delivered)` runs once when
    the response ends: `delivered` is False when the client went away or stopped reading.
    """

    def __init__(
        self,
        chunks: Iterable[bytes] | AsyncIterator[bytes],
        *,
        media_type: str,
        send_timeout_s: float,
        headers: dict[str, str] | None = None,
        content_length: int | None = None,
        status_code: int = 200,
        on_close: Callable[[bool], None] | None = None,
    ):
        # (as Starlette's StreamingResponse, no body: the base initialiser would declare a length of 0)
        self.chunks, self.media_type, self.send_timeout_s = chunks, media_type, send_timeout_s
        self.status_code, self.on_close, self.background = status_code, on_close, None
        self.raw_headers = [(b"content-type", media_type.encode())]
        if content_length is not None:
            self.raw_headers.append((b"content-length", str(content_length).encode()))
        self.raw_headers += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]

    async def __call__(self, scope, receive, send) -> None:
        sender = asyncio.ensure_future(self._send_all(scope, send))
        watcher = asyncio.ensure_future(_disconnected(receive))
        delivered = False
        try:
            await asyncio.wait({sender, watcher}, return_when=asyncio.FIRST_COMPLETED)
            if sender.done():
                delivered = sender.result()
        finally:
            for task in (sender, watcher):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            self.chunks = ()  # the answer's memory goes now, before on_close hands it back to the OS
            if self.on_close is not None:
                self.on_close(delivered)

    async def _send_all(self, scope, send) -> bool:
        """Send everything; False if the client stopped reading (its connection is then dropped)."""
        start = {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
        sent = await self._send(send, start)
        async for chunk in _aiter(self.chunks):
            sent = sent and await self._send(send, {"type": "http.response.body", "body": chunk, "more_body": True})
            if not sent:
                break
        if sent and await self._send(send, {"type": "http.response.body", "body": b"", "more_body": False}):
            return True
        logger.info("answer not read", extra={"seconds": self.send_timeout_s})
        abort = scope.get("extensions", {}).get(ABORT)
        if abort is None:  # another server than hooked serve's: it closes the connection on an error
            raise TimeoutError(f"the client read nothing for {self.send_timeout_s} s")
        abort()
        return False

    async def _send(self, send, message: dict) -> bool:
        """Whether `message` was taken within the send timeout."""
        try:
            await asyncio.wait_for(send(message), self.send_timeout_s)
        except asyncio.TimeoutError:
            return False
        return True


async def _disconnected(receive) -> None:
    """Return when the client has gone away (the request body, if unread, is drained on the way)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


async def _aiter(chunks: Iterable[bytes] | AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    if hasattr(chunks, "__aiter__"):
        async for chunk in chunks:  # type: ignore[union-attr]  # (checked just above)
            yield chunk
    else:
        for chunk in chunks:  # type: ignore[union-attr]
            yield chunk
            await asyncio.sleep(0)  # let other connections run between slices


def base64_line(key: str, chunks: Iterable[bytes]) -> Iterator[bytes]:
    """`{"<key>": "<base64 of the chunks>"}` and a newline, produced slice by slice."""
    yield b'{"' + key.encode() + b'": "'
    rest = b""
    for chunk in chunks:
        data = rest + chunk
        cut = len(data) - len(data) % 3  # base64 of whole 3-byte groups joins without padding
        if cut:
            yield base64.b64encode(data[:cut])
        rest = data[cut:]
    if rest:
        yield base64.b64encode(rest)
    yield b'"}\n'


__all__ = ["ABORT", "TimedResponse", "base64_line"]
