"""Fair scheduling of model jobs from many users on one worker thread.

Every job waits in its user's queue; the worker takes the next job round-robin over the
users with work, so one user's hundred requests delay another's single request by at most
one job. One thread runs the model (a model serves one forward at a time), so the
concurrency limit is on jobs admitted (queued + running), globally and per user. Quotas
(tokens per minute, returned bytes per minute) are checked on admission over a sliding
minute. A job is dropped when its client disconnects or its deadline passes: before it
starts, or at its next step (generation step, patching chunk) once running.

Compatible forward jobs from different users (plain logits, no hooks, no cache, same dtype
and length) run as one batched forward when `max_batch > 1`, then are split row-wise.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from collections import OrderedDict, defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hooked.core.errors import JobCancelled, JobTimeout, WireError

logger = logging.getLogger("hooked.serve")


@dataclass
class SchedulerOptions:
    """Limits of one server (`hooked serve` options set them)."""

    max_jobs: int = 64  # queued + running, all users
    max_jobs_per_user: int = 8
    tokens_per_minute: int = 200_000  # per user, prompt + generated tokens
    bytes_per_minute: int = 2 * 2**30  # per user, response bytes
    request_timeout_s: float = 120.0
    max_batch: int = 1  # plain forwards batched together; 1 = never (batched BLAS may round differently)


@dataclass
class Job:
    """One request's work: `run(job)` executes on the worker thread and returns the result."""

    user: str
    kind: str
    run: Callable[[Job], Any]
    tokens: int = 0
    batch_key: tuple | None = None  # jobs with equal keys may share one forward
    batch_input: Any = None
    id: str = ""
    created: float = field(default_factory=time.monotonic)
    deadline: float = 0.0
    timeout_s: float = 0.0
    cancelled: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)
    events: queue.Queue = field(default_factory=queue.Queue)  # streamed progress, read by the HTTP handler
    result: Any = None
    error: BaseException | None = None
    state: str = "queued"
    request: bytes = b""  # the request message (a pipeline's rank 0 sends it to the other ranks)
    interruptible: bool = True  # False: once running, it runs to the end (every pipeline rank must)

    def check(self) -> None:
        """Raise if the job should stop now (called between steps)."""
        if self.state == "running" and not self.interruptible:
            return
        if self.cancelled.is_set():
            raise JobCancelled()
        if time.monotonic() > self.deadline:
            raise JobTimeout(self.timeout_s)

    def emit(self, event: dict) -> None:
        self.events.put(event)

    def finish(self, result=None, error: BaseException | None = None) -> None:
        self.result = None if self.cancelled.is_set() else result  # nobody will read a cancelled job's answer
        self.error = error
        self.state = "failed" if error is not None else "done"
        self.done.set()


class Scheduler:
    """Admits jobs, queues them per user and runs them round-robin on one worker thread."""

    def __init__(
        self,
        options: SchedulerOptions,
        run_batch: Callable[[list[Job]], list[Any]] | None = None,
        before_run: Callable[[Job], None] | None = None,
        on_idle: Callable[[], None] | None = None,
        idle_every_s: float = 10.0,
    ):
        self.options = options
        self.run_batch = run_batch
        self.before_run, self.on_idle, self.idle_every_s = before_run, on_idle, idle_every_s
        self.queues: OrderedDict[str, deque[Job]] = OrderedDict()
        self.jobs: dict[str, Job] = {}  # id -> job, kept for status until pruned
        self.counts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        self.usage: dict[str, deque[tuple[float, int, int]]] = defaultdict(deque)  # (time, tokens, bytes)
        self.running: list[Job] = []
        self.accepting = True
        self._ids = itertools.count(1)
        self._lock = threading.Condition()
        self._stop = False
        self._thread = threading.Thread(target=self._loop, name="hooked-serve-worker", daemon=True)
        self._thread.start()

    # -- admission ---------------------------------------------------------------------------
    def submit(self, job: Job) -> Job:
        with self._lock:
            if not self.accepting:
                raise WireError("the server is shutting down: retry on another server or later", 503)
            active = [j for j in self.jobs.values() if not j.done.is_set()]
            if len(active) >= self.options.max_jobs:
                raise WireError(f"the server has {len(active)} jobs in flight, its limit: retry shortly", 503)
            mine = sum(1 for j in active if j.user == job.user)
            if mine >= self.options.max_jobs_per_user:
                raise WireError(f"you have {mine} requests in flight, the per-user limit: wait for one to finish", 429)
            self._check_quota(job)
            job.id = f"{next(self._ids)}-{time.time_ns() % 10**9:09d}"
            job.timeout_s = self.options.request_timeout_s
            job.deadline = job.created + job.timeout_s
            self.usage[job.user].append((time.monotonic(), job.tokens, 0))
            self.jobs[job.id] = job
            self.queues.setdefault(job.user, deque()).append(job)
            self.counts[job.user]["requests"] += 1
            self._prune()
            self._lock.notify_all()
        return job

    def _check_quota(self, job: Job) -> None:
        window = self.usage[job.user]
        now = time.monotonic()
        while window and window[0][0] < now - 60:
            window.popleft()
        tokens, sent = sum(u[1] for u in window), sum(u[2] for u in window)
        if tokens + job.tokens > self.options.tokens_per_minute:
            raise WireError(
                f"quota: {tokens} tokens in the last minute + {job.tokens} would exceed "
                f"{self.options.tokens_per_minute} tokens/minute: wait and retry",
                429,
            )
        if sent >= self.options.bytes_per_minute:
            raise WireError(
                f"quota: {sent} response bytes in the last minute (limit {self.options.bytes_per_minute})", 429
            )

    def record_bytes(self, user: str, n: int) -> None:
        with self._lock:
            self.usage[user].append((time.monotonic(), 0, n))
            self.counts[user]["bytes"] += n

    def _prune(self) -> None:
        finished = [k for k, j in self.jobs.items() if j.done.is_set()]
        for k in finished[: max(0, len(finished) - 1000)]:  # keep the last 1000 finished jobs for status
            del self.jobs[k]

    # -- the worker ------------------------------------------------------------------------
    def _next(self) -> list[Job] | None:
        """Round-robin: the first user with work goes to the back. Caller holds the lock."""
        for user in list(self.queues):
            q = self.queues[user]
            if not q:
                continue
            self.queues.move_to_end(user)
            job = q.popleft()
            group = [job]
            if job.batch_key is not None and self.run_batch is not None:
                for other in list(self.queues):  # one compatible job from the head of each other user's queue
                    oq = self.queues[other]
                    if len(group) >= self.options.max_batch:
                        break
                    if other != user and oq and oq[0].batch_key == job.batch_key and not oq[0].cancelled.is_set():
                        group.append(oq.popleft())
            return group
        return None

    def _loop(self) -> None:
        idle_since = time.monotonic()
        while True:
            with self._lock:
                group = self._next()
                while group is None and not self._stop:
                    self._lock.wait(timeout=0.5)
                    group = self._next()
                    if group is None and self.on_idle is not None and time.monotonic() - idle_since > self.idle_every_s:
                        break
                # (the wait above ends without a group only on stop, or for on_idle)
                if group is None and not self._stop and self.on_idle is not None:
                    idle_since = time.monotonic()
                    try:
                        self.on_idle()  # e.g. a pipeline's heartbeat to its other ranks
                    except Exception:  # noqa: BLE001 - logged; jobs then fail or time out with a clear answer
                        logger.exception("idle callback failed")
                    continue
                if group is None:
                    return
                self.running = group
                for job in group:
                    job.state = "running"
            self._run(group)
            idle_since = time.monotonic()
            with self._lock:
                self.running = []
                self._lock.notify_all()

    def _run(self, group: list[Job]) -> None:
        live = []
        for job in group:
            try:
                job.check()
                live.append(job)
            except WireError as e:
                self._fail(job, e)
        if not live:
            return
        started = time.monotonic()
        if len(live) > 1:
            assert self.run_batch is not None  # jobs are grouped only when there is a run_batch
            self.counts["*"]["batched_jobs"] += len(live)
            try:
                results = self.run_batch(live)
            except Exception as e:  # noqa: BLE001 - one failing batch fails its jobs, never the worker
                for job in live:
                    self._fail(job, e)
                return
            for job, result in zip(live, results, strict=True):
                job.finish(result)
                self.counts[job.user]["done"] += 1
        else:
            job = live[0]
            try:
                if self.before_run is not None:
                    self.before_run(job)
                job.finish(job.run(job))
                self.counts[job.user]["done"] += 1
            except Exception as e:  # noqa: BLE001 - reported to the client; the worker goes on
                self._fail(job, e)
        logger.info(
            "ran",
            extra={
                "job_ids": [j.id for j in live],
                "kind": live[0].kind,
                "batch": len(live),
                "seconds": round(time.monotonic() - started, 4),
            },
        )

    def _fail(self, job: Job, error: BaseException) -> None:
        self.counts[job.user]["failed"] += 1
        job.finish(error=error)

    # -- status and shutdown -----------------------------------------------------------------
    def snapshot(self) -> dict:
        with self._lock:
            return {
                "queued": sum(len(q) for q in self.queues.values()),
                "running": [{"id": j.id, "user": j.user, "kind": j.kind} for j in self.running],
                "users": {u: dict(c) for u, c in self.counts.items()},
                "accepting": self.accepting,
            }

    def drain(self, timeout_s: float) -> bool:
        """Stop admitting, wait (at most `timeout_s`) for queued and running jobs; True if all finished."""
        end = time.monotonic() + timeout_s
        with self._lock:
            self.accepting = False
            while any(self.queues.values()) or self.running:
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self._lock.wait(timeout=min(left, 0.5))
        return True

    def close(self, timeout_s: float = 5.0) -> None:
        with self._lock:
            self._stop = True
            for q in self.queues.values():
                for job in q:
                    self._fail(job, WireError("the server stopped before this job ran", 503))
                q.clear()
            self._lock.notify_all()
        self._thread.join(timeout=timeout_s)
