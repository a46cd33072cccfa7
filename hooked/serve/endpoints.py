"""The HTTP endpoints of `hooked serve`: module-level functions reading `request.app.state.serve`.

Each endpoint is `fn(request, user, rid)`, wrapped by `endpoint(fn, access)` into a Starlette
endpoint that authenticates first (before any body is read), turns every failure into an
answer (a `BaseException` from a native library included, never a dead process) and logs one
line. A request that sends a body reserves its place in flight before the body is read, so a
user's uploads count against their in-flight limit and the server's memory budget.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import parse_qs, quote

from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

from hooked.core.errors import HookedError, JobCancelled, WireError
from hooked.serve import auth as auth_module
from hooked.serve import ops, pages, wire
from hooked.serve.answers import TimedResponse, base64_line
from hooked.serve.scheduler import Job
from hooked.serve.state import ServeState

logger = logging.getLogger("hooked.serve")
POLL_S = 0.02
MAX_FORM_BYTES = 4096


def state_of(request: Request) -> ServeState:
    return request.app.state.serve


def status_of(error: BaseException) -> tuple[int, str]:
    """The HTTP status and message of a failure."""
    if isinstance(error, WireError):
        return error.status, str(error)
    if isinstance(error, HookedError) or getattr(error, "hook_point_name", None):
        where = getattr(error, "hook_point_name", None)
        return 422, (f"hook on {where!r} failed: " if where else "") + f"{type(error).__name__}: {error}"
    return 500, f"internal error ({type(error).__name__}); the request id is in the server log"


def error_response(request: Request, rid: str, error: BaseException) -> Response:
    status, message = status_of(error)
    if status >= 500:
        logger.error("request failed", extra={"request_id": rid}, exc_info=error)
    if status == 401 and "text/html" in request.headers.get("accept", "") and request.method == "GET":
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        return RedirectResponse(f"/login?next={quote(target, safe='')}", status_code=303)
    return JSONResponse({"error": message, "request_id": rid}, status_code=status)


def endpoint(fn, access: str = "token"):
    """`fn(request, user, rid)` as a Starlette endpoint. `access`: "token" (API), "page" (a token or a
    browser session), "optional" (as "page", anonymous when neither) or "none"."""

    async def handle(request: Request) -> Response:
        state, rid = state_of(request), uuid.uuid4().hex[:12]
        started, user = time.monotonic(), "-"
        try:
            user = _authenticate(state, request, access)
            response = await fn(request, user, rid)
        except (KeyboardInterrupt, SystemExit, asyncio.CancelledError):
            raise
        except BaseException as e:  # noqa: BLE001 - every failure is an answer, never a crash
            response = error_response(request, rid, e)
        response.headers["x-request-id"] = rid
        extra: dict[str, Any] = {
            "request_id": rid,
            "user": user or "-",
            "method": request.method,
            "path": request.url.path,
        }
        extra.update(status=response.status_code, ms=round(1000 * (time.monotonic() - started), 1))
        logger.info("request", extra=extra)
        return response

    handle.__name__ = fn.__name__
    return handle


def _authenticate(state: ServeState, request: Request, access: str) -> str | None:
    if access == "none":
        return None
    if access == "optional":
        try:
            return state.auth.user(request, cookie=True)
        except WireError:
            return None
    return state.auth.user(request, cookie=access == "page")


# -- reading a request ---------------------------------------------------------------------------
def _declared_length(state: ServeState, request: Request) -> int:
    limit = state.options.wire.max_body_bytes
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > limit):
        raise WireError(f"body of {declared!r:.20} bytes exceeds the limit of {limit} (--max-body-mb)", 413)
    return limit if declared is None else int(declared)


async def read_body(state: ServeState, request: Request) -> bytes:
    """The whole body, within the size limit and the body timeout (408 past it)."""
    limit, timeout = state.options.wire.max_body_bytes, state.options.connections.body_timeout_s
    deadline = time.monotonic() + timeout
    chunks, size = [], 0
    stream = request.stream().__aiter__()
    while True:
        try:
            chunk = await asyncio.wait_for(stream.__anext__(), max(0.0, deadline - time.monotonic()))
        except StopAsyncIteration:
            break
        except asyncio.TimeoutError:
            raise WireError(f"the body did not arrive within {timeout:g} s (--body-timeout)", 408) from None
        size += len(chunk)
        if size > limit:
            raise WireError(f"body exceeds the limit of {limit} bytes (--max-body-mb)", 413)
        chunks.append(chunk)
    return b"".join(chunks)


async def submit(state: ServeState, request: Request, user: str) -> Job:
    """Reserve a place in flight, read and check the body, estimate and admit the job, queue it."""
    job = state.scheduler.reserve(user, _declared_length(state, request))
    try:
        data = await read_body(state, request)

        def prepare():  # off the event loop: decoding and checking a large body takes a while
            body, tensors = wire.decode(data, state.options.wire)
            return ops.make_job(state.ctx, user, body, tensors), sum(t.nbytes for t in tensors.values())

        work, held = await asyncio.to_thread(prepare)
        job.take(work)
        job.held_bytes = held
        if state.relay is not None:  # every rank runs the request as sent: keep its bytes until it runs
            job.request, job.interruptible, job.held_bytes = data, False, held + len(data)
        del data
        return state.scheduler.enqueue(job)
    except BaseException as e:
        state.scheduler.abandon(job, e)
        raise


async def wait(request: Request, job: Job, drain_s: float) -> None:
    """Until the job is done; cancels it if the client disconnects. Bounded by the job's deadline."""
    limit = time.monotonic() + job.timeout_s + drain_s
    while not job.done.is_set():
        if await request.is_disconnected():
            job.cancelled.set()
            raise JobCancelled("the client disconnected")
        if time.monotonic() > limit:
            job.cancelled.set()
            raise WireError("the job did not finish in time", 504)
        await asyncio.sleep(POLL_S)


async def queue_job(state: ServeState, user: str, make, relay_message: dict) -> Job:
    """Reserve, build (`make()`, off the event loop) and queue a job that has no request body."""
    job = state.scheduler.reserve(user, 0)
    try:
        job.take(await asyncio.to_thread(make))
        if state.relay is not None:
            job.request, job.interruptible = wire.encode(relay_message), False
        return state.scheduler.enqueue(job)
    except BaseException as e:
        state.scheduler.abandon(job, e)
        raise


def result_of(job: Job):
    """The finished job's result (its error raised), taken from the job."""
    if job.error is not None:
        raise job.error
    if job.result is None:  # cancelled (DELETE /v1/jobs/{id}) after it finished
        raise JobCancelled()
    result, job.result = job.result, None
    return result


# -- answers -------------------------------------------------------------------------------------
def answer_message(state: ServeState, job: Job, body: dict, tensors: dict) -> wire.Message:
    """The answer as a message, within `--max-answer-bytes`; it is what the job holds until delivered."""
    message = wire.Message(body, tensors)
    limit = state.ctx.limits.max_answer_bytes
    if limit is not None and message.nbytes > limit:
        raise WireError(f"the answer is {message.nbytes} bytes, over the limit of {limit} (--max-answer-bytes)", 413)
    job.held_bytes = message.nbytes
    state.scheduler.record_bytes(job.user, message.nbytes)
    return message


def answer_response(state: ServeState, job: Job, message: wire.Message) -> TimedResponse:
    """Send `message` slice by slice; the job leaves the flight when it is delivered or given up."""
    return TimedResponse(
        message.chunks(),
        media_type=wire.CONTENT_TYPE,
        send_timeout_s=state.options.connections.send_timeout_s,
        headers={"x-job-id": job.id},
        content_length=message.nbytes,
        on_close=lambda delivered: state.scheduler.settle(job),
    )


async def stream_lines(state: ServeState, job: Job) -> AsyncIterator[bytes]:
    """JSON lines: the job id, its progress events, then the result (base64) or an error."""
    yield json.dumps({"job": job.id}).encode() + b"\n"
    limit = time.monotonic() + job.timeout_s + state.options.drain_timeout_s
    while not (job.done.is_set() and job.events.empty()):
        while not job.events.empty():
            yield json.dumps(job.events.get_nowait()).encode() + b"\n"
        if time.monotonic() > limit:
            job.cancelled.set()
            yield json.dumps({"error": "the job did not finish in time", "status": 504}).encode() + b"\n"
            return
        await asyncio.sleep(POLL_S)
    try:
        body, tensors = result_of(job)
        message = answer_message(state, job, {**body, "job": job.id}, tensors)
    except (KeyboardInterrupt, SystemExit, asyncio.CancelledError):
        raise
    except BaseException as e:  # noqa: BLE001 - the stream has begun: the error is its last line
        status, text = status_of(e)
        yield json.dumps({"error": text, "status": status}).encode() + b"\n"
        return
    for piece in base64_line("result", message.chunks()):
        yield piece


# -- the endpoints -------------------------------------------------------------------------------
async def health(request: Request, user, rid) -> Response:
    return JSONResponse({"status": "ok", "accepting": state_of(request).scheduler.accepting})


async def favicon(request: Request, user, rid) -> Response:
    return Response(status_code=204)


async def status_page(request: Request, user, rid) -> Response:
    state = state_of(request)
    return HTMLResponse(pages.status_page(state.scheduler.snapshot(), state.model.cfg, user))


async def login_form(request: Request, user, rid) -> Response:
    return HTMLResponse(pages.login_page(pages.safe_next(request.query_params.get("next", "/"))))


async def login(request: Request, user, rid) -> Response:
    """Exchange a token (POSTed by the login form) for a session cookie, then go back where the user was."""
    state = state_of(request)
    data = await read_body(state, request) if int(request.headers.get("content-length") or 0) <= MAX_FORM_BYTES else b""
    form = parse_qs(data.decode("utf-8", "replace"))
    next_path = pages.safe_next(form.get("next", ["/"])[0])
    found = state.auth.user_of_token(form.get("token", [""])[0]) if state.auth.enabled else "local"
    if found is None:
        return HTMLResponse(pages.login_page(next_path, "Unknown token."), status_code=401)
    response = RedirectResponse(next_path, status_code=303)
    if state.auth.enabled:
        session = state.auth.start_session(found)
        response.set_cookie(
            auth_module.COOKIE, session, max_age=auth_module.SESSION_S, httponly=True, samesite="strict",
            secure=request.url.scheme == "https",
        )  # fmt: skip
    return response


async def logout(request: Request, user, rid) -> Response:
    state_of(request).auth.end_session(request.cookies.get(auth_module.COOKIE, ""))
    response = RedirectResponse("/", status_code=303)
    response.delete_cookie(auth_module.COOKIE)
    return response


async def inspect_page(request: Request, user: str, rid) -> Response:
    state = state_of(request)
    prompt = request.query_params.get("prompt", "")
    if not prompt or len(prompt) > 2000:
        raise WireError("pass ?prompt= (1 to 2000 characters)", 422)
    job = await queue_job(
        state, user, lambda: ops.inspect_job(state.ctx, user, prompt), {"op": "inspect", "prompt": prompt}
    )
    try:
        await wait(request, job, state.options.drain_timeout_s)
        page = result_of(job)
    finally:
        state.scheduler.settle(job)
    return HTMLResponse(page, headers={"x-job-id": job.id})


async def model_endpoint(request: Request, user, rid) -> Response:
    return JSONResponse(state_of(request).info)


async def weights(request: Request, user: str, rid) -> Response:
    state = state_of(request)
    part = request.path_params["part"]
    job = await queue_job(state, user, lambda: ops.weights_job(state.ctx, user, part), {"op": "weights", "part": part})
    try:
        await wait(request, job, state.options.drain_timeout_s)
        message = answer_message(state, job, {"part": part}, result_of(job))
    except BaseException:
        state.scheduler.settle(job)
        raise
    return answer_response(state, job, message)


async def run_endpoint(request: Request, user: str, rid) -> Response:
    state = state_of(request)
    job = await submit(state, request, user)
    try:
        await wait(request, job, state.options.drain_timeout_s)
        body, tensors = result_of(job)
        message = answer_message(state, job, {**body, "job": job.id}, tensors)
    except BaseException:
        state.scheduler.settle(job)
        raise
    return answer_response(state, job, message)


async def stream_endpoint(request: Request, user: str, rid) -> Response:
    state = state_of(request)
    job = await submit(state, request, user)

    def closed(delivered: bool) -> None:
        if not job.done.is_set():  # the client went away mid-stream
            job.cancelled.set()
        state.scheduler.settle(job)

    return TimedResponse(
        stream_lines(state, job),
        media_type="application/x-ndjson",
        send_timeout_s=state.options.connections.send_timeout_s,
        headers={"x-job-id": job.id},
        on_close=closed,
    )


def _owned(request: Request, user: str) -> Job:
    job = state_of(request).scheduler.jobs.get(request.path_params["job_id"])
    if job is None:
        raise WireError("no such job", 404)
    if job.user != user:
        raise WireError("this job belongs to another user", 403)
    return job


async def job_status(request: Request, user: str, rid) -> Response:
    job = _owned(request, user)
    status: dict[str, Any] = {"id": job.id, "kind": job.kind, "state": job.state}
    if job.cost is not None:
        status["estimate"] = {
            "peak_bytes": job.cost.peak_bytes, "answer_bytes": job.cost.answer_bytes, "forwards": job.cost.forwards
        }  # fmt: skip
    return JSONResponse(status)


async def job_cancel(request: Request, user: str, rid) -> Response:
    job = _owned(request, user)
    job.cancelled.set()
    return JSONResponse({"id": job.id, "cancelled": True})


__all__ = [
    "answer_message",
    "endpoint",
    "error_response",
    "read_body",
    "status_of",
    "submit",
    "wait",
]
