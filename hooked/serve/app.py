"""The ASGI application of `hooked serve` (Starlette): its routes, built over its state (hooked/serve/state.py).

Routes (all but `/health`, `/`, `/login` and `/logout` need a token when auth is on):

    GET    /health              liveness and whether the server accepts work
    GET    /                    status page: counts; with a login also the model and requests per user
    GET    /login, POST /login  a browser exchanges its token for a session cookie (POST /logout ends it)
    GET    /inspect?prompt=...  `hooked inspect --html`'s views of one prompt (a token or a session)
    GET    /v1/model            config, hook names and tokenizer files (sent once to each client)
    GET    /v1/weights/{part}   parameters of `blocks.<n>`, `unembed`, `ln_final`, `embed`, `pos_embed`
    POST   /v1/run              one job, answered with one safetensors message
    POST   /v1/stream           one job, answered with JSON lines: progress, tokens, then the result
    GET    /v1/jobs/{id}        a job's state and cost estimate (its owner only)
    DELETE /v1/jobs/{id}        cancel a job (its owner only)

`create_app` only builds the state (`ServeState`, on `app.state.serve`) and wires the
module-level endpoints of `hooked.serve.endpoints` to these routes.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import json
import logging
import tempfile
from pathlib import Path

import torch

from hooked.core.errors import HookedError, JobCancelled  # noqa: F401 - importable from here before
from hooked.serve import costs, endpoints, memory, ops, wire
from hooked.serve.auth import Auth, parse_tokens
from hooked.serve.endpoints import POLL_S  # noqa: F401 - importable from here before
from hooked.serve.scheduler import Job, Scheduler, SchedulerOptions  # noqa: F401 - (Job: as above)
from hooked.serve.state import ServeOptions, ServeState

logger = logging.getLogger("hooked.serve")
#: Shares of the memory left after loading the model (`memory.headroom_bytes()`) that the default budgets take.
REQUEST_SHARE, ANSWER_SHARE, HELD_SHARE = 0.5, 0.25, 0.4
#: Largest default answer: a course server answers activations, not checkpoints.
MAX_DEFAULT_ANSWER = 2**30


def model_info(model, limits: ops.ServeLimits | None = None) -> dict:
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
    limits = limits or ops.ServeLimits()
    return {
        "cfg": cfg,
        "hook_names": list(model.hook_dict),
        "pos_axes": {n: hp.pos_axis for n, hp in model.hook_dict.items()},
        "inactive": [n for n, hp in model.hook_dict.items() if not model.is_active(hp)],
        "tokenizer_files": files,
        "padding_side": getattr(model, "default_padding_side", "right"),
        "limits": {k: v for k, v in dataclasses.asdict(limits).items() if v is not None},
    }


def resolve_budgets(options: ServeOptions) -> ServeOptions:
    """`options` with every memory budget left unset derived from the memory left now (after loading)."""
    headroom = memory.headroom_bytes()
    limits = options.limits
    request = limits.max_request_memory or int(REQUEST_SHARE * headroom)
    answer = limits.max_answer_bytes or min(MAX_DEFAULT_ANSWER, int(ANSWER_SHARE * headroom))
    scheduler = options.scheduler
    held = scheduler.max_held_bytes or int(HELD_SHARE * headroom)
    user_held = scheduler.max_user_held_bytes or min(held, answer + options.wire.max_body_bytes)
    logger.info(
        "budgets",
        extra={"estimate": f"headroom {headroom}, per request {request}, answer {answer}, held {held}/{user_held}"},
    )
    return dataclasses.replace(
        options,
        limits=dataclasses.replace(limits, max_request_memory=request, max_answer_bytes=answer),
        scheduler=dataclasses.replace(scheduler, max_held_bytes=held, max_user_held_bytes=user_held),
    )


def _scheduler(model, options: ServeOptions, relay) -> Scheduler:
    if relay is not None:  # every rank runs each request as sent
        options.scheduler.max_batch = 1
        return Scheduler(options.scheduler, before_run=relay.send, on_idle=relay.heartbeat)
    return Scheduler(options.scheduler, run_batch=lambda jobs: ops.run_batched_forward(model, jobs))


def _probe(model, scheduler: Scheduler, relay) -> costs.ActivationSizes:
    """The activation sizes; on a pipeline, the probe forwards run as jobs every rank executes."""
    if relay is None:
        return costs.ActivationSizes.probe(model)
    names = [n for n, hp in model.hook_dict.items() if model.is_active(hp)]
    ctx = ops.Context(model, ops.ServeLimits(max_tokens_per_request=64))

    def run(tokens):
        body = {"op": "forward", "cache": names}
        job = ops.make_job(ctx, "probe", body, {"tokens": tokens})
        job.request, job.interruptible = wire.encode(body, {"tokens": tokens}), False
        scheduler.submit(job).done.wait(600)
        (_, out) = endpoints.result_of(job)
        return out["logits"], {k[6:]: v for k, v in out.items() if k.startswith("cache/")}

    return costs.ActivationSizes.probe(model, run)


def create_app(model, tokens: dict[str, str] | None = None, options: ServeOptions | None = None, relay=None):
    """A Starlette app serving `model`; `tokens` maps user -> bearer token (None: no auth, loopback only).

    `relay` (a pipeline's rank 0: `hooked.serve.pipeline.Relay`) sends each job's request to the
    other ranks just before it runs, so every rank executes it.
    """
    from starlette.applications import Starlette
    from starlette.routing import Route

    memory.map_large_blocks()  # freed tensors leave the process: its memory stays what is alive
    options = resolve_budgets(options or ServeOptions())
    model.eval()
    scheduler = _scheduler(model, options, relay)
    sizes = _probe(model, scheduler, relay)
    ctx = ops.Context(model, options.limits, sizes)
    state = ServeState(model, ctx, scheduler, Auth(tokens), options, model_info(model, options.limits), relay)
    e = endpoints
    routes = [
        Route("/health", e.endpoint(e.health, "none")),
        Route("/favicon.ico", e.endpoint(e.favicon, "none")),
        Route("/", e.endpoint(e.status_page, "optional")),
        Route("/login", e.endpoint(e.login_form, "none"), methods=["GET"]),
        Route("/login", e.endpoint(e.login, "none"), methods=["POST"]),
        Route("/logout", e.endpoint(e.logout, "none"), methods=["POST"]),
        Route("/inspect", e.endpoint(e.inspect_page, "page")),
        Route("/v1/model", e.endpoint(e.model_endpoint)),
        Route("/v1/weights/{part}", e.endpoint(e.weights)),
        Route("/v1/run", e.endpoint(e.run_endpoint), methods=["POST"]),
        Route("/v1/stream", e.endpoint(e.stream_endpoint), methods=["POST"]),
        Route("/v1/jobs/{job_id}", e.endpoint(e.job_status), methods=["GET"]),
        Route("/v1/jobs/{job_id}", e.endpoint(e.job_cancel), methods=["DELETE"]),
    ]
    app = Starlette(routes=routes, lifespan=_lifespan)
    app.state.serve = state
    app.state.scheduler, app.state.model, app.state.auth = scheduler, model, state.auth
    return app


@contextlib.asynccontextmanager
async def _lifespan(app):
    yield
    state: ServeState = app.state.serve
    drained = await asyncio.to_thread(state.scheduler.drain, state.options.drain_timeout_s)
    if not drained and not state.scheduler.stopped:  # served without hooked.serve.server: stop what is left now
        state.scheduler.stop_unfinished()
        await asyncio.to_thread(state.scheduler.drain, state.options.drain_timeout_s)
    logger.info("shutdown", extra={"drained": not state.scheduler.stopped, "job_ids": state.scheduler.stopped})
    state.scheduler.close()


__all__ = ["ServeOptions", "ServeState", "create_app", "model_info", "parse_tokens", "resolve_budgets"]
