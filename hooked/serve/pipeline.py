"""`hooked serve` for a model split over torch.distributed ranks (`hooked.scale.pipeline`).

Rank 0 answers HTTP and schedules jobs as usual. Just before a job runs, rank 0 broadcasts its
request message (the same bytes the client sent) to every rank; each other rank decodes it with
the same checks and runs the same job, so the pipeline's collectives line up. While idle, rank 0
broadcasts a heartbeat every few seconds so the others' waits (bounded by the process group's
timeout) never expire; on shutdown it broadcasts a stop. A job, once started, runs to its end on
every rank (a rank leaving early would strand the others' collectives); cancellation and timeouts
apply while it is queued.
"""

from __future__ import annotations

import logging

import torch

from hooked.serve import ops, wire
from hooked.serve.scheduler import Job

logger = logging.getLogger("hooked.serve")
HEARTBEAT = wire.encode({"op": "heartbeat"})
STOP = wire.encode({"op": "stop"})


def _broadcast_bytes(data: bytes | None, device) -> bytes:
    """Collective: rank 0's `data` on every rank (a length, then the bytes as uint8)."""
    from hooked.scale.collectives import broadcast_tensor

    payload = None if data is None else torch.frombuffer(bytearray(data), dtype=torch.uint8)
    return bytes(broadcast_tensor(payload, 0, device).cpu().numpy().tobytes())


class Relay:
    """Rank 0's side: sends each job's request (and heartbeats, and the stop) to the other ranks."""

    def __init__(self, model):
        self.model = model

    def send(self, job: Job) -> None:
        _broadcast_bytes(job.request, self.model.device)

    def heartbeat(self) -> None:
        _broadcast_bytes(HEARTBEAT, self.model.device)

    def stop(self) -> None:
        _broadcast_bytes(STOP, self.model.device)


def follow(model, options) -> None:
    """The other ranks' loop: run every request rank 0 relays until it relays the stop."""
    while True:
        data = _broadcast_bytes(None, model.device)
        body, tensors = wire.decode(data, options.wire)
        op = body.get("op")
        if op == "stop":
            return
        if op == "heartbeat":
            continue
        try:
            run_relayed(model, op, body, tensors, options)
        except Exception as e:  # noqa: BLE001 - rank 0 reports the same failure to its client
            logger.info("relayed job failed", extra={"kind": op, "error": f"{type(e).__name__}: {e}"[:200]})


def run_relayed(model, op: str | None, body: dict, tensors: dict, options):
    """Run one request rank 0 relayed (rank 0 admitted it: no cost checks here)."""
    if op == "weights":
        return ops.weights_of(model, body["part"])
    if op == "inspect":
        return ops.inspect_html(model, body["prompt"])
    job = ops.make_job(ops.Context(model, options.limits), "relay", body, tensors)
    job.interruptible, job.state, job.deadline = False, "running", float("inf")
    assert job.run is not None  # a job made from a request has its work
    return job.run(job)


def serve_pipeline(model, host: str, port: int, tokens, options, ssl_certfile=None, ssl_keyfile=None) -> None:
    """Rank 0 serves HTTP (see `hooked.serve.run`); every other rank follows it. A collective."""
    if model.rank != 0:
        follow(model, options)
        return
    from hooked.serve.app import create_app
    from hooked.serve.server import run_app

    relay = Relay(model)
    app = create_app(model, tokens, options, relay=relay)
    try:
        run_app(app, host, port, ssl_certfile, ssl_keyfile)
    finally:
        relay.stop()
