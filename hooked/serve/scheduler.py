"""Fair scheduling of model jobs from many users on one worker thread.

Every job waits in its user's queue; the worker takes the next job round-robin over the
users with work, so one user's hundred requests delay another's single request by at most
one job. One thread runs the model (a model serves one forward at a time), so the
concurrency limit is on jobs admitted, globally and per user. A job is in flight from the
moment its request is authenticated (`reserve`, before its body is read) until its answer
has been delivered (`settle`), and while in flight it holds memory: its request's tensors,
then its answer. That memory is counted against a global and a per-user budget, and quotas
(tokens per minute, returned bytes per minute) are checked on admission over a sliding
minute. A job stops when its client disconnects, its deadline passes or the server shuts
down: before it starts, or inside its next forward once running (`Job.check`).

A finished job keeps only its status (id, user, kind, state, times): its request, work,
inputs, events and answer are dropped once the answer is delivered (`Job.release`).

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

from hooked.core.errors import JobCancelled, JobTimeout, ShuttingDown, WireError
from hooked.serve import memory

logger = logging.getLogger("hooked.serve")
#: After a job or an answer this large, freed memory is handed back to the operating system.
RELEASE_AFTER_BYTES = 16 * 2**20
#: Finished jobs whose status stays listed (`GET /v1/jobs/{id}`).
KEEP_FINISHED = 1000


@dataclass
class SchedulerOptions:
    """Limits of one server (`hooked serve` options set them)."""

    max_jobs: int = 64  # in flight (receiving, queued, running or answering), all users
    max_jobs_per_user: int = 8
    tokens_per_minute: int = 200_000  # per user, prompt + generated tokens
    bytes_per_minute: int = 2 * 2**30  # per user, response bytes
    request_timeout_s: float = 120.0
    max_batch: int = 1  # plain forwards batched together; 1 = never (batched BLAS may round differently)
    max_held_bytes: int | None = None  # request tensors and undelivered answers, all users (None: unbounded)
    max_user_held_bytes: int | None = None  # the same, per user


@dataclass(eq=False)
class Job:
    """One request's work: `run(job)` executes on the worker thread and returns the result."""

    user: str
    kind: str
    run: Callable[[Job], Any] | None
    tokens: int = 0
    batch_key: tuple | None = None  # jobs with equal keys may share one forward
    batch_input: Any = None
    id: str = ""
    created: float = field(default_factory=time.monotonic)
    deadline: float = 0.0
    timeout_s: float = 0.0
    cancelled: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)
    delivered: threading.Event = field(default_factory=threading.Event)
    events: queue.Queue = field(default_factory=queue.Queue)  # streamed progress, read by the HTTP handler
    result: Any = None
    error: BaseException | None = None
    state: str = "queued"
    request: bytes = b""  # the request message (a pipeline's rank 0 sends it to the other ranks)
    interruptible: bool = True  # False: once running, it runs to the end (every pipeline rank must)
    held_bytes: int = 0  # memory held while in flight: the request's tensors, then the answer
    holds_answer: bool = False  # an HTTP handler delivers the answer; in flight until `Scheduler.settle`
    cost: Any = None  # the admission estimate (`hooked.serve.costs.Cost`), for logs and status
    shutdown: threading.Event | None = None  # set when the server stops unfinished jobs

    def check(self) -> None:
        """Raise if the job should stop now (called between steps and in every forward)."""
        if self.state == "running" and not self.interruptible:
            return
        if self.cancelled.is_set():
            raise JobCancelled()
        if self.shutdown is not None and self.shutdown.is_set():
            raise ShuttingDown()
        if time.monotonic() > self.deadline:
            raise JobTimeout(self.timeout_s)

    def emit(self, event: dict) -> None:
        self.events.put(event)

    def take(self, work: Job) -> None:
        """Take the work of `work` (built once the request was read) into this reserved job."""
        self.kind, self.run, self.tokens, self.cost = work.kind, work.run, work.tokens, work.cost
        self.batch_key, self.batch_input = work.batch_key, work.batch_input

    def finish(self, result=None, error: BaseException | None = None) -> None:
        unread = self.cancelled.is_set() or self.delivered.is_set()  # nobody will read this answer
        self.result = None if unread else result
        self.error = error
        self.state = "failed" if error is not None else "done"
        self.run, self.batch_input, self.request = None, None, b""  # the work and its inputs are spent
        self.done.set()
        if not self.holds_answer:
            self.delivered.set()

    def release(self) -> None:
        """Keep only the status: drop the answer, the events and what the job held."""
        self.run, self.batch_input, self.request, self.result = None, None, b"", None
        self.events = queue.Queue()
        self.held_bytes = 0


def outcome(job: Job) -> str:
    """The log message of a finished job: "ran", "cancelled", "timed out", "stopped at shutdown" or "failed"."""
    for kind, message in (
        (JobCancelled, "cancelled"),
        (JobTimeout, "timed out"),
        (ShuttingDown, "stopped at shutdown"),
    ):
        if isinstance(job.error, kind):
            return message
    return "ran" if job.error is None else "failed"


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
        self.stopped: list[str] = []  # ids of the jobs a shutdown stopped before they finished
        self._shutdown = threading.Event()
        self._ids = itertools.count(1)
        self._lock = threading.Condition()
        self._stop = False
        self._thread = threading.Thread(target=self._loop, name="hooked-serve-worker", daemon=True)
        self._thread.start()

    # -- admission ---------------------------------------------------------------------------
    def reserve(self, user: str, nbytes: int) -> Job:
        """A place in flight for `user`'s next request, holding `nbytes` (its body), before the body is read."""
        job = Job(user, "receiving", None, held_bytes=nbytes, holds_answer=True)
        with self._lock:
            self._check_room(job)
            self._register(job)
        return job

    def enqueue(self, job: Job) -> Job:
        """Queue a reserved job now that its work is known (its `held_bytes` now its tensors)."""
        with self._lock:
            if not self.accepting:
                raise WireError("the server is shutting down: retry on another server or later", 503)
            self._check_held(job, exclude=job)
            self._check_quota(job)
            self._queue(job)
        return job

    def submit(self, job: Job) -> Job:
        """Admit and queue `job` in one step (jobs the server makes itself, and tests)."""
        with self._lock:
            self._check_room(job)
            self._check_quota(job)
            self._register(job)
            self._queue(job)
        return job

    def abandon(self, job: Job, error: BaseException) -> None:
        """A reserved job whose request was refused before it ran: it leaves the flight at once."""
        with self._lock:
            job.finish(error=error)
            self.counts[job.user]["refused"] += 1
        self.settle(job)

    def settle(self, job: Job) -> None:
        """The answer is delivered (or given up): the job leaves the flight and keeps only its status."""
        big = job.held_bytes >= RELEASE_AFTER_BYTES
        with self._lock:
            job.delivered.set()
            job.release()
            self._lock.notify_all()
        if big:
            memory.release()

    def _in_flight(self) -> list[Job]:
        """Jobs being received, queued, running or answered (a job given up counts until it stops)."""
        return [j for j in self.jobs.values() if not (j.delivered.is_set() and j.done.is_set())]

    def _check_room(self, job: Job) -> None:
        if not self.accepting:
            raise WireError("the server is shutting down: retry on another server or later", 503)
        active = self._in_flight()
        if len(active) >= self.options.max_jobs:
            raise WireError(f"the server has {len(active)} requests in flight, its limit: retry shortly", 503)
        mine = sum(1 for j in active if j.user == job.user)
        if mine >= self.options.max_jobs_per_user:
            raise WireError(f"you have {mine} requests in flight, the per-user limit: wait for one to finish", 429)
        self._check_held(job)

    def _check_held(self, job: Job, exclude: Job | None = None) -> None:
        """The memory held by requests in flight stays within the global and the per-user budget."""
        active = [j for j in self._in_flight() if j is not exclude]
        total = sum(j.held_bytes for j in active) + job.held_bytes
        limit = self.options.max_held_bytes
        if limit is not None and total > limit:
            raise WireError(
                f"the requests in flight hold {total - job.held_bytes} bytes and this one {job.held_bytes}: over "
                f"the server's {limit} bytes for requests and answers in flight; retry shortly",
                503,
            )
        mine = sum(j.held_bytes for j in active if j.user == job.user) + job.held_bytes
        limit = self.options.max_user_held_bytes
        if limit is not None and mine > limit:
            raise WireError(
                f"your requests in flight would hold {mine} bytes, over the per-user limit of {limit}: "
                "read your answers (or wait for them) before sending more",
                429,
            )

    def _register(self, job: Job) -> None:
        job.id = f"{next(self._ids)}-{time.time_ns() % 10**9:09d}"
        job.timeout_s = self.options.request_timeout_s
        job.deadline = job.created + job.timeout_s
        job.shutdown = self._shutdown
        self.jobs[job.id] = job
        self._prune()

    def _queue(self, job: Job) -> None:
        job.deadline = time.monotonic() + job.timeout_s  # the body's upload has its own timeout
        job.state = "queued"
        self.usage[job.user].append((time.monotonic(), job.tokens, 0))
        self.queues.setdefault(job.user, deque()).append(job)
        self.counts[job.user]["requests"] += 1
        self._lock.notify_all()

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
        finished = [k for k, j in self.jobs.items() if j.delivered.is_set() and j.done.is_set()]
        for k in finished[: max(0, len(finished) - KEEP_FINISHED)]:
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

    def _wait_for_work(self, idle_since: float) -> list[Job] | None:
        """The next group, or None on stop or when `on_idle` is due. Caller holds the lock."""
        group = self._next()
        while group is None and not self._stop:
            self._lock.wait(timeout=0.5)
            group = self._next()
            if group is None and self.on_idle is not None and time.monotonic() - idle_since > self.idle_every_s:
                break
        return group

    def _loop(self) -> None:
        idle_since = time.monotonic()
        while True:
            with self._lock:
                group = self._wait_for_work(idle_since)
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
                self._log([job], 0.0)
        if not live:
            return
        started = time.monotonic()
        if len(live) > 1:
            self._run_batched(live)
        else:
            self._run_one(live[0])
        self._log(live, time.monotonic() - started)
        if any(j.cost is not None and j.cost.peak_bytes >= RELEASE_AFTER_BYTES for j in live):
            memory.release()

    def _run_batched(self, live: list[Job]) -> None:
        assert self.run_batch is not None  # jobs are grouped only when there is a run_batch
        self.counts["*"]["batched_jobs"] += len(live)
        try:
            results = self.run_batch(live)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as e:  # noqa: BLE001 - one failing batch fails its jobs, never the worker
            for job in live:
                self._fail(job, e)
            return
        for job, result in zip(live, results, strict=True):
            job.finish(result)
            self.counts[job.user]["done"] += 1

    def _run_one(self, job: Job) -> None:
        try:
            if self.before_run is not None:
                self.before_run(job)
            assert job.run is not None  # a queued job has its work
            job.finish(job.run(job))
            self.counts[job.user]["done"] += 1
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as e:  # noqa: BLE001 - a panic in a native library too: reported, the worker goes on
            self._fail(job, e)

    def _log(self, jobs: list[Job], seconds: float) -> None:
        job = jobs[0]
        extra = {"job_ids": [j.id for j in jobs], "kind": job.kind, "batch": len(jobs), "seconds": round(seconds, 4)}
        if job.error is not None:
            extra["error"] = f"{type(job.error).__name__}: {job.error}"[:300]
        if job.cost is not None:
            extra["estimate"] = job.cost.describe()
        logger.info(outcome(job), extra=extra)

    def _fail(self, job: Job, error: BaseException) -> None:
        self.counts[job.user]["failed"] += 1
        if isinstance(error, ShuttingDown):
            self.stopped.append(job.id)
        job.finish(error=error)

    # -- status and shutdown -----------------------------------------------------------------
    def snapshot(self) -> dict:
        with self._lock:
            return {
                "queued": sum(len(q) for q in self.queues.values()),
                "running": [{"id": j.id, "user": j.user, "kind": j.kind} for j in self.running],
                "in_flight": len(self._in_flight()),
                "users": {u: dict(c) for u, c in self.counts.items()},
                "accepting": self.accepting,
            }

    def begin_shutdown(self) -> None:
        """Admit nothing more; what is queued or running goes on until `stop_unfinished`."""
        with self._lock:
            self.accepting = False

    def stop_unfinished(self) -> list[str]:
        """The grace period is over: queued jobs fail with 503 and running ones stop in their next forward.

        Each stopped job is logged by id ("stopped at shutdown": the queued ones here, the running ones
        when they stop) and listed in `stopped`. Returns the ids of the queued ones.
        """
        with self._lock:
            self.accepting = False
            self._shutdown.set()
            failed = []
            for q in self.queues.values():
                for job in q:
                    self._fail(job, ShuttingDown())
                    self._log([job], 0.0)
                    failed.append(job.id)
                q.clear()
            self._lock.notify_all()
        return failed

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
        return not self.stopped

    def close(self, timeout_s: float = 5.0) -> None:
        with self._lock:
            self._stop = True
            for q in self.queues.values():
                for job in q:
                    self._fail(job, ShuttingDown("the server stopped before this job ran"))
                q.clear()
            self._lock.notify_all()
        self._thread.join(timeout=timeout_s)


__all__ = ["Job", "JobCancelled", "JobTimeout", "Scheduler", "SchedulerOptions", "WireError", "outcome"]
