"""The scheduler alone (no model, no HTTP): round-robin fairness, limits, quotas, cancellation,
timeouts, batching and draining. Jobs are plain functions; every wait is bounded."""

from __future__ import annotations

import threading
import time

import pytest

from hooked.serve.scheduler import Job, JobCancelled, JobTimeout, Scheduler, SchedulerOptions
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
