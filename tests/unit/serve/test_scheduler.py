"""The scheduler alone (no model, no HTTP): round-robin fairness, limits, quotas, cancellation,
timeouts, batching, draining, delivery, memory budgets, shutdown and outcome logs. Jobs are plain
functions; every wait is bounded."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from hooked.core.errors import ShuttingDown
from hooked.serve.scheduler import Job, JobCancelled, JobTimeout, Scheduler, SchedulerOptions, outcome
from hooked.serve.wire import WireError

WAIT = 10.0


def _sched(**kw):
    return Scheduler(SchedulerOptions(**kw), run_batch=lambda jobs: [("batched", len(jobs))] * len(jobs))


def _gate():
    """A job that blocks the worker until released, so the queue can be filled deterministically."""
    release = threading.Event()
    return release, Job("gate", "x", lambda job: release.wait(WAIT))


def test_round_robin_across_users():
    s = _sched(max_jobs_per_user=20)
    order = []
    release, gate = _gate()
    s.submit(gate)
    jobs = [s.submit(Job(u, "x", lambda job, u=u, i=i: order.append((u, i)))) for u in "ab" for i in range(3)]
    jobs.append(s.submit(Job("c", "x", lambda job: order.append(("c", 0)))))
    release.set()
    assert all(j.done.wait(WAIT) for j in jobs)
    assert order == [("a", 0), ("b", 0), ("c", 0), ("a", 1), ("b", 1), ("a", 2), ("b", 2)]
    s.close()


def test_limits_and_quotas_refuse_with_429_and_503():
    s = _sched(max_jobs=3, max_jobs_per_user=2, tokens_per_minute=100)
    release, gate = _gate()
    s.submit(gate)
    s.submit(Job("a", "x", lambda job: None, tokens=10))
    with pytest.raises(WireError) as e:
        s.submit(Job("a", "x", lambda job: None, tokens=95))  # 105 tokens this minute
    assert e.value.status == 429
    s.submit(Job("a", "x", lambda job: None, tokens=10))
    with pytest.raises(WireError) as e:
        s.submit(Job("a", "x", lambda job: None))  # a third in flight for a
    assert e.value.status in (429, 503)
    with pytest.raises(WireError) as e:
        s.submit(Job("b", "x", lambda job: None))  # 3 in flight overall
    assert e.value.status == 503
    release.set()
    s.close()


def test_cancelled_and_expired_jobs_stop_and_the_worker_goes_on():
    s = _sched(request_timeout_s=0.3)
    release, gate = _gate()
    s.submit(gate)
    queued = s.submit(Job("a", "x", lambda job: "never"))
    queued.cancelled.set()

    def long_job(job):
        for _ in range(1000):
            job.check()
            time.sleep(0.01)

    running = s.submit(Job("b", "x", long_job))
    release.set()
    assert queued.done.wait(WAIT) and isinstance(queued.error, JobCancelled)
    assert running.done.wait(WAIT) and isinstance(running.error, JobTimeout) and running.error.status == 504
    failing = s.submit(Job("a", "x", lambda job: 1 / 0))
    assert failing.done.wait(WAIT) and isinstance(failing.error, ZeroDivisionError)
    ok = s.submit(Job("a", "x", lambda job: 42))
    assert ok.done.wait(WAIT) and ok.result == 42
    s.close()


def test_compatible_jobs_of_different_users_share_a_batch():
    s = _sched(max_batch=3)
    release, gate = _gate()
    s.submit(gate)
    jobs = [s.submit(Job(u, "forward", lambda job: "alone", batch_key=("f", 5))) for u in "abcd"]
    other = s.submit(Job("e", "forward", lambda job: "alone", batch_key=("f", 6)))
    release.set()
    assert all(j.done.wait(WAIT) for j in [*jobs, other])
    assert [j.result for j in jobs] == [("batched", 3)] * 3 + ["alone"]
    assert other.result == "alone"
    s.close()


def test_drain_finishes_in_flight_work_and_refuses_new():
    s = _sched()
    done = s.submit(Job("a", "x", lambda job: time.sleep(0.2) or "finished"))
    assert s.drain(WAIT)
    assert done.result == "finished"
    with pytest.raises(WireError) as e:
        s.submit(Job("a", "x", lambda job: None))
    assert e.value.status == 503
    s.close()


def test_returned_bytes_quota():
    s = _sched(bytes_per_minute=1000)
    first = s.submit(Job("a", "x", lambda job: None))
    assert first.done.wait(WAIT)
    s.record_bytes("a", 1500)
    with pytest.raises(WireError) as e:
        s.submit(Job("a", "x", lambda job: None))
    assert e.value.status == 429 and "response bytes" in str(e.value)
    assert s.submit(Job("b", "x", lambda job: None)).done.wait(WAIT)  # other users unaffected
    s.close()


def test_a_job_is_in_flight_until_its_answer_is_delivered():
    s = _sched(max_jobs_per_user=2)
    first = s.reserve("a", 0)  # before its body is read
    second = s.reserve("a", 0)
    with pytest.raises(WireError) as e:
        s.reserve("a", 0)
    assert e.value.status == 429
    first.take(Job("a", "x", lambda job: "answer"))
    s.enqueue(first)
    assert first.done.wait(WAIT) and first.result == "answer"
    with pytest.raises(WireError):  # done, but its answer not yet sent
        s.reserve("a", 0)
    s.settle(first)
    assert first.result is None and first.run is None and first.state == "done"  # only the status stays
    s.abandon(second, WireError("bad request"))
    s.reserve("a", 0)
    s.close()


def test_memory_held_in_flight_is_budgeted_per_user_and_globally():
    s = _sched(max_held_bytes=1000, max_user_held_bytes=600)
    a = s.reserve("a", 500)
    with pytest.raises(WireError) as e:
        s.reserve("a", 200)  # a would hold 700
    assert e.value.status == 429
    s.reserve("b", 450)
    with pytest.raises(WireError) as e:
        s.reserve("c", 100)  # 1050 in all
    assert e.value.status == 503
    s.abandon(a, WireError("gone"))
    s.reserve("c", 100)
    s.close()


def test_shutdown_stops_what_is_unfinished_and_says_so(caplog):
    s = _sched(max_jobs_per_user=4)

    def long_job(job):
        for _ in range(1000):
            job.check()
            time.sleep(0.01)

    running = s.submit(Job("a", "sweep", long_job))
    queued = s.submit(Job("b", "forward", lambda job: "never"))
    s.begin_shutdown()
    with pytest.raises(WireError) as e:
        s.submit(Job("c", "x", lambda job: None))
    assert e.value.status == 503
    time.sleep(0.1)
    with caplog.at_level(logging.INFO, logger="hooked.serve"):
        stopped = s.stop_unfinished()
        assert running.done.wait(WAIT) and queued.done.wait(WAIT)
    assert stopped == [queued.id] and s.stopped == [queued.id, running.id]
    assert isinstance(running.error, ShuttingDown) and isinstance(queued.error, ShuttingDown)
    assert running.error.status == 503 and "shutting down" in str(queued.error)
    assert not s.drain(WAIT)  # something was cut
    assert {r.getMessage() for r in caplog.records} >= {"stopped at shutdown"}
    s.close()


class Panic(BaseException):
    """What a native library's panic looks like from Python: not an Exception."""


def test_outcomes_are_logged_by_name_and_a_panic_fails_only_its_job(caplog):
    s = _sched(request_timeout_s=0.2)

    def slow(job):
        while True:
            job.check()
            time.sleep(0.01)

    with caplog.at_level(logging.INFO, logger="hooked.serve"):
        jobs = [s.submit(Job("a", "x", fn)) for fn in (lambda job: 1, slow)]
        assert jobs[1].done.wait(WAIT)
        cancelled = Job("b", "x", slow)
        s.submit(cancelled)
        cancelled.cancelled.set()
        panicking = s.submit(Job("c", "x", lambda job: (_ for _ in ()).throw(Panic("boom"))))
        assert cancelled.done.wait(WAIT) and panicking.done.wait(WAIT)
        assert s.submit(Job("c", "x", lambda job: 2)).done.wait(WAIT)  # the worker lives on
    assert isinstance(panicking.error, Panic)
    assert [outcome(j) for j in (*jobs, cancelled, panicking)] == ["ran", "timed out", "cancelled", "failed"]
    assert {"ran", "timed out", "cancelled", "failed"} <= {r.getMessage() for r in caplog.records}
    s.close()
