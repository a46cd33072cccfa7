"""Shards are atomic and the manifest lists only complete ones: SIGKILL, a full disk, other arguments, bad dirs."""

from __future__ import annotations

import errno
import json
import os
import random
import signal
import subprocess
import time

import pytest

from hooked.harvest import ActivationReader, HarvestMismatchError, HarvestWriteError, harvest, writer
from tests.unit.harvest._harvest_common import (  # noqa: F401  (fixtures)
    HOOKS,
    assert_same_harvest,
    corpus_dir_fixture,
    model_dir_fixture,
    model_fixture,
    worker_cmd,
    worker_env,
)

ARGS = dict(hooks=HOOKS, context_length=8, batch_size=2, batches_per_shard=1, dtype="float16")


def _listed_shards(out) -> list[dict]:
    path = out / writer.MANIFEST
    return json.loads(path.read_text())["shards"] if path.exists() else []


def _kill_when(proc, out, shards: int, delay: float, deadline: float = 180) -> int:
    """SIGKILL `proc` `delay` seconds after the manifest lists `shards` shards; return how many it listed."""
    start = time.monotonic()
    while len(_listed_shards(out)) < shards and proc.poll() is None:
        assert time.monotonic() - start < deadline, "the harvest subprocess made no progress"
        time.sleep(0.005)
    time.sleep(delay)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    return len(_listed_shards(out))


@pytest.mark.slow
def test_sigkill_at_random_points_then_resume_gives_the_uninterrupted_harvest(model, model_dir, corpus_dir, tmp_path):
    full = harvest(model, corpus_dir, out=tmp_path / "full", progress=False, **ARGS)
    n = len(full["shards"])
    assert n > 20
    rng = random.Random(21)
    out = tmp_path / "killed"
    listed = []
    for shards, delay in [(rng.randrange(1, n // 3), 0.0), (n // 3 + 1, rng.uniform(0.0, 0.3))]:
        proc = subprocess.Popen(
            worker_cmd(model_dir, corpus_dir, out, **ARGS),
            env=worker_env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        listed.append(_kill_when(proc, out, shards, delay))
        reader = ActivationReader(out)  # what the manifest lists is complete and readable after each kill
        assert len(reader) == sum(s["rows"] for s in full["shards"][: len(reader.shards)])
        assert [s["index"] for s in reader.shards] == list(range(len(reader.shards)))
        for i in range(len(reader.shards)):
            reader.read_shard(i)
    assert 0 < listed[0] < listed[1] < n, listed  # both kills landed mid-run
    resumed = harvest(model, corpus_dir, out=out, progress=False, **ARGS)
    assert [s["index"] for s in resumed["shards"]] == list(range(n))
    assert [s["rows"] for s in resumed["shards"]] == [s["rows"] for s in full["shards"]]
    assert_same_harvest(tmp_path / "full", out)


def test_full_disk_leaves_completed_shards_valid_and_resume_finishes(model, corpus_dir, tmp_path, monkeypatch):
    harvest(model, corpus_dir, out=tmp_path / "full", progress=False, max_tokens=160, **ARGS)
    real, calls = writer.write_bytes, []

    def full_after_three(path, data):
        calls.append(path)
        if len(calls) > 3:
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        real(path, data)

    monkeypatch.setattr(writer, "write_bytes", full_after_three)
    out = tmp_path / "partial"
    with pytest.raises(HarvestWriteError, match="disk is full") as info:
        harvest(model, corpus_dir, out=out, progress=False, max_tokens=160, **ARGS)
    assert str(out) in str(info.value) and info.value.errno == errno.ENOSPC
    assert [s["index"] for s in _listed_shards(out)] == [0, 1, 2]
    assert not list(out.glob("*.tmp"))
    assert len(ActivationReader(out).read_all(HOOKS[0])) == 3 * 16
    monkeypatch.setattr(writer, "write_bytes", real)
    harvest(model, corpus_dir, out=out, progress=False, max_tokens=160, **ARGS)
    assert_same_harvest(tmp_path / "full", out)


def test_other_arguments_on_an_existing_output_raise(model, corpus_dir, tmp_path):
    harvest(model, corpus_dir, out=tmp_path, progress=False, max_tokens=64, **ARGS)
    with pytest.raises(HarvestMismatchError, match=r"dtype: existing 'float16', now 'float32'.*new output directory"):
        harvest(model, corpus_dir, out=tmp_path, progress=False, max_tokens=64, **dict(ARGS, dtype="float32"))
    (tmp_path.parent / "other.txt").write_text("another corpus entirely")
    with pytest.raises(HarvestMismatchError, match="corpus_fingerprint"):
        harvest(model, tmp_path.parent / "other.txt", out=tmp_path, progress=False, max_tokens=64, **ARGS)


def test_unwritable_output_directory_raises_naming_it(model, corpus_dir, tmp_path):
    (tmp_path / "file").write_text("")
    out = tmp_path / "file" / "acts"
    with pytest.raises(HarvestWriteError, match=f"Cannot write harvest output to '{out}'"):
        harvest(model, corpus_dir, out=out, progress=False, **ARGS)
