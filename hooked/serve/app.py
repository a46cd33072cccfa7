"""The ASGI application of `hooked serve` (Starlette): routes, authentication, limits, logs.

Routes (all but `/health` and `/` need `Authorization: Bearer <token>` when auth is on):

    GET    /health              liveness and whether the server accepts work
    GET    /                    status page: model, queue, requests per user
    GET    /inspect?prompt=...  `hooked inspect --html`'s views of one prompt
    GET    /v1/model            config, hook names and tokenizer files (sent once to each client)
    GET    /v1/weights/{part}   parameters of `blocks.<n>`, `unembed`, `ln_final`, `embed`, `pos_embed`
    POST   /v1/run              one job, answered with one safetensors message
    POST   /v1/stream           one job, answered with JSON lines: progress, tokens, then the result
    GET    /v1/jobs/{id}        a job's state (its owner only)
    DELETE /v1/jobs/{id}        cancel a job (its owner only)
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hmac
import html
import json
import logging
import re
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import torch

from hooked.core.errors import HookedError
from hooked.serve import ops, wire
from hooked.serve.scheduler import Job, JobCancelled, Scheduler, SchedulerOptions

logger = logging.getLogger("hooked.serve")
POLL_S = 0.02


@dataclass
class ServeOptions:
    """Everything `hooked serve` configures besides the model and the tokens."""

    scheduler: SchedulerOptions = field(default_factory=SchedulerOptions)
    limits: ops.ServeLimits = field(default_factory=ops.ServeLimits)
    wire: wire.Limits = field(default_factory=wire.Limits)
    drain_timeout_s: float = 30.0


def model_info(model) -> dict:
    """Config, hook names and tokenizer files: what a client needs to mirror the model."""
    cfg = {}
    for k, v in model.cfg.to_dict().items():
        cfg[k] = str(v).removeprefix("torch.") if isinstance(v, (torch.dtype, torch.device)) else v
    cfg = json.loads(json.dumps(cfg, default=str))
    files = {}
    if model.tokenizer is not None:
        with tempfile.TemporaryDirectory() as tmp:
            model.tokenizer.save_pretrained(tmp)
            for path in sorted(Path(tmp).iterdir()):
                if path.is_file() and path.suffix in (".json", ".txt", ".jinja", ".model"):
                    files[path.name] = base64.b64encode(path.read_bytes()).decode()
    return {
        "cfg": cfg,
        "hook_names": list(model.hook_dict),
        "pos_axes": {n: hp.pos_axis for n, hp in model.hook_dict.items()},
        "inactive": [n for n, hp in model.hook_dict.items() if not model.is_active(hp)],
        "tokenizer_files": files,
        "padding_side": getattr(model, "default_padding_side", "right"),
        "limits": {"max_tokens_per_request": ops.ServeLimits().max_tokens_per_request},
    }


class Auth:
    """Bearer tokens per user, compared in constant time against every known token."""

    def __init__(self, tokens: dict[str, str] | None):
        self.tokens = {user: token.encode() for user, token in (tokens or {}).items()}

    @property
    def enabled(self) -> bool:
        return bool(self.tokens)

    def user(self, request) -> str:
        if not self.enabled:
            return "local"
        header = request.headers.get("authorization", "")
        scheme, _, given = header.partition(" ")
        if scheme.lower() != "bearer" or not given:
            raise wire.WireError("missing 'Authorization: Bearer <token>' header", 401)
        found = None
        for user, token in self.tokens.items():  # no early exit: the time does not depend on which matched
            if hmac.compare_digest(token, given.strip().encode()):
                found = user
        if found is None:
            raise wire.WireError("unknown token", 401)
        return found


def parse_tokens(text: str) -> dict[str, str]:
    """`user token` pairs, one per line (or separated by commas); blank lines and `#` comments skipped."""
    out: dict[str, str] = {}
    for n, line in enumerate(text.replace(",", "\n").splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split()
        if len(parts) != 2:
            raise HookedError(f"tokens line {n}: expected 'user token', got {len(parts)} fields")
        user, token = parts
        if not re.fullmatch(r"[A-Za-z0-9_.@-]{1,64}", user):
            raise HookedError(f"tokens line {n}: user names are 1-64 letters, digits or _.@- (got {user[:64]!r})")
        if len(token) < 16:
            raise HookedError(f"tokens line {n}: the token of {user!r} is shorter than 16 characters")
        if user in out:
            raise HookedError(f"tokens line {n}: user {user!r} appears twice")
        out[user] = token
    return out


def _status_of(error: BaseException) -> tuple[int, str]:
    if isinstance(error, wire.WireError):
        return error.status, str(error)
    if isinstance(error, HookedError) or getattr(error, "hook_point_name", None):
        where = getattr(error, "hook_point_name", None)
        return 422, (f"hook on {where!r} failed: " if where else "") + f"{type(error).__name__}: {error}"
    return 500, f"internal error ({type(error).__name__}); the request id is in the server log"


def create_app(model, tokens: dict[str, str] | None = None, options: ServeOptions | None = None, relay=None):
    """A Starlette app serving `model`; `tokens` maps user -> bearer token (None: no auth, loopback only).

    `relay` (a pipeline's rank 0: `hooked.serve.pipeline.Relay`) sends each job's request to the
    other ranks just before it runs, so every rank executes it.
    """
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
    from starlette.routing import Route

    options = options or ServeOptions()
    auth = Auth(tokens)
    model.eval()
    info = model_info(model)
    if relay is not None:
        options.scheduler.max_batch = 1  # every rank runs each request as sent
        scheduler = Scheduler(options.scheduler, before_run=relay.send, on_idle=relay.heartbeat)
    else:
        scheduler = Scheduler(options.scheduler, run_batch=lambda jobs: ops.run_batched_forward(model, jobs))

    def queued(job: Job, message: dict) -> Job:
        """Submit `job`; on a pipeline it carries `message` for the other ranks and runs to the end once started."""
        job.request = wire.encode(message)
        job.interruptible = relay is None
        return scheduler.submit(job)

    def error_response(rid: str, error: BaseException) -> JSONResponse:
        status, message = _status_of(error)
        if status >= 500:
            logger.error("request failed", extra={"request_id": rid}, exc_info=error)
        return JSONResponse({"error": message, "request_id": rid}, status_code=status)

    def handler(fn):
        async def endpoint(request: Request):
            rid = uuid.uuid4().hex[:12]
            started, user, status = time.monotonic(), "-", 500
            try:
                user = auth.user(request) if fn.__name__ not in ("health", "status_page") else "-"
                response = await fn(request, user, rid)
            except Exception as e:  # noqa: BLE001 - every failure is an answer, never a crash
                response = error_response(rid, e)
            status = response.status_code
            response.headers["x-request-id"] = rid
            logger.info(
                "request",
                extra={
                    "request_id": rid,
                    "user": user,
                    "method": request.method,
                    "path": request.url.path,
                    "status": status,
                    "ms": round(1000 * (time.monotonic() - started), 1),
                },
            )
            return response

        return endpoint

    async def read_body(request: Request) -> bytes:
        limit = options.wire.max_body_bytes
        declared = request.headers.get("content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > limit):
            raise wire.WireError(f"body of {declared!r:.20} bytes exceeds the limit of {limit}", 413)
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise wire.WireError(f"body exceeds the limit of {limit} bytes", 413)
            chunks.append(chunk)
        return b"".join(chunks)

    async def submit(request: Request, user: str) -> Job:
        data = await read_body(request)

        def prepare() -> Job:  # off the event loop: decoding and checking a large body takes a while
            body, tensors = wire.decode(data, options.wire)
            return ops.make_job(model, user, body, tensors, options.limits)

        job = await asyncio.to_thread(prepare)
        job.request, job.interruptible = data, relay is None
        return scheduler.submit(job)

    async def wait(request: Request, job: Job) -> None:
        """Until the job is done; cancels it if the client disconnects. Bounded by the job's deadline."""
        limit = time.monotonic() + job.timeout_s + options.drain_timeout_s
        while not job.done.is_set():
            if await request.is_disconnected():
                job.cancelled.set()
                raise JobCancelled("the client disconnected")
            if time.monotonic() > limit:
                job.cancelled.set()
                raise wire.WireError("the job did not finish in time", 504)
            await asyncio.sleep(POLL_S)

    def encode_result(job: Job) -> bytes:
        if job.error is not None:
            raise job.error
        if job.result is None:  # cancelled (DELETE /v1/jobs/{id}) after it finished
            raise JobCancelled()
        body, tensors = job.result
        job.result = None  # finished jobs stay listed for status; their tensors need not
        data = wire.encode({**body, "job": job.id}, tensors)
        scheduler.record_bytes(job.user, len(data))
        return data

    async def health(request, user, rid):
        return JSONResponse({"status": "ok", "accepting": scheduler.accepting})

    async def status_page(request, user, rid):
        snap = scheduler.snapshot()
        rows = "".join(
            f"<tr><td>{html.escape(u)}</td><td>{c.get('requests', 0)}</td><td>{c.get('done', 0)}</td>"
            f"<td>{c.get('failed', 0)}</td></tr>"
            for u, c in sorted(snap["users"].items())
            if u != "*"
        )
        name = html.escape(str(model.cfg.model_name))
        page = (
            f"<!doctype html><html><head><meta charset='utf-8'><title>hooked serve: {name}</title></head><body>"
            f"<h1>hooked serve</h1><p id='model'>Model: <b>{name}</b> ({model.cfg.n_layers} layers, "
            f"d_model {model.cfg.d_model})</p><p id='queue'>Queued: {snap['queued']}; running: "
            f"{len(snap['running'])}; accepting: {snap['accepting']}</p>"
            f"<table id='users'><tr><th>user</th><th>requests</th><th>done</th><th>failed</th></tr>{rows}</table>"
            "<p>Views of a prompt: <code>GET /inspect?prompt=...</code> (authenticated).</p></body></html>"
        )
        return HTMLResponse(page)

    async def inspect_page(request, user, rid):
        prompt = request.query_params.get("prompt", "")
        if not prompt or len(prompt) > 2000:
            raise wire.WireError("pass ?prompt= (1 to 2000 characters)", 422)

        tokens = len(model.to_tokens(prompt, truncate=False)[0])
        job = queued(
            Job(user, "inspect", lambda job: ops.inspect_html(model, prompt), tokens=tokens),
            {"op": "inspect", "prompt": prompt},
        )
        await wait(request, job)
        if job.error is not None:
            raise job.error
        page, job.result = job.result, None
        return HTMLResponse(page)

    async def model_endpoint(request, user, rid):
        return JSONResponse(info)

    async def weights(request, user, rid):
        part = request.path_params["part"]
        ops.check_part(model, part)
        job = queued(Job(user, "weights", lambda job: ops.weights_of(model, part)), {"op": "weights", "part": part})
        await wait(request, job)
        if job.error is not None:
            raise job.error
        tensors, job.result = job.result, None
        data = await asyncio.to_thread(wire.encode, {"part": part}, tensors)
        scheduler.record_bytes(user, len(data))
        return Response(data, media_type=wire.CONTENT_TYPE)

    async def run_endpoint(request, user, rid):
        job = await submit(request, user)
        await wait(request, job)
        data = await asyncio.to_thread(encode_result, job)
        return Response(data, media_type=wire.CONTENT_TYPE, headers={"x-job-id": job.id})

    async def stream_endpoint(request, user, rid):
        job = await submit(request, user)

        async def lines():
            limit = time.monotonic() + job.timeout_s + options.drain_timeout_s
            try:
                yield json.dumps({"job": job.id}) + "\n"
                while True:
                    while not job.events.empty():
                        yield json.dumps(job.events.get_nowait()) + "\n"
                    if job.done.is_set() and job.events.empty():
                        break
                    if time.monotonic() > limit:
                        job.cancelled.set()
                        yield json.dumps({"error": "the job did not finish in time", "status": 504}) + "\n"
                        return
                    await asyncio.sleep(POLL_S)
                try:
                    data = await asyncio.to_thread(encode_result, job)
                    yield json.dumps({"result": base64.b64encode(data).decode()}) + "\n"
                except Exception as e:  # noqa: BLE001 - the stream has begun: the error is its last line
                    status, message = _status_of(e)
                    yield json.dumps({"error": message, "status": status}) + "\n"
            finally:
                if not job.done.is_set():  # the client went away mid-stream
                    job.cancelled.set()

        return StreamingResponse(lines(), media_type="application/x-ndjson", headers={"x-job-id": job.id})

    def owned(request, user) -> Job:
        job = scheduler.jobs.get(request.path_params["job_id"])
        if job is None:
            raise wire.WireError("no such job", 404)
        if job.user != user:
            raise wire.WireError("this job belongs to another user", 403)
        return job

    async def job_status(request, user, rid):
        job = owned(request, user)
        return JSONResponse({"id": job.id, "kind": job.kind, "state": job.state})

    async def job_cancel(request, user, rid):
        job = owned(request, user)
        job.cancelled.set()
        return JSONResponse({"id": job.id, "cancelled": True})

    @contextlib.asynccontextmanager
    async def lifespan(app):
        yield
        drained = await asyncio.to_thread(scheduler.drain, options.drain_timeout_s)
        logger.info("shutdown", extra={"drained": drained})
        scheduler.close()

    routes = [
        Route("/health", handler(health)),
        Route("/favicon.ico", lambda request: Response(status_code=204)),
        Route("/", handler(status_page)),
        Route("/inspect", handler(inspect_page)),
        Route("/v1/model", handler(model_endpoint)),
        Route("/v1/weights/{part}", handler(weights)),
        Route("/v1/run", handler(run_endpoint), methods=["POST"]),
        Route("/v1/stream", handler(stream_endpoint), methods=["POST"]),
        Route("/v1/jobs/{job_id}", handler(job_status), methods=["GET"]),
        Route("/v1/jobs/{job_id}", handler(job_cancel), methods=["DELETE"]),
    ]
    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.scheduler, app.state.model, app.state.auth = scheduler, model, auth
    return app
