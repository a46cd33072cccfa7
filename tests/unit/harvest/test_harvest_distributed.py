"""Two gloo ranks (two processes on 127.0.0.1) harvest disjoint shards whose union is the 1-process harvest."""

from __future__ import annotations

import json
import subprocess

import pytest

from hooked.harvest import harvest
from tests.unit.harvest._harvest_common import (  # noqa: F401  (fixtures)
    HOOKS,
    assert_same_harvest,
    corpus_dir_fixture,
    free_port,
    model_dir_fixture,
    model_fixture,
    worker_cmd,
    worker_env,
)

ARGS = dict(hooks=HOOKS, context_length=8, batch_size=3, batches_per_shard=2, max_tokens=400)


@pytest.mark.slow
def test_two_gloo_ranks_equal_one_process(model, model_dir, corpus_dir, tmp_path):
    single = harvest(model, corpus_dir, out=tmp_path / "one", progress=False, **ARGS)
    out, port = tmp_path / "two", free_port()
    procs = [
        subprocess.Popen(
            worker_cmd(model_dir, corpus_dir, out, **ARGS),
            stderr=subprocess.PIPE,
            text=True,
            env=worker_env(
                RANK=r,
                LOCAL_RANK=r,
                WORLD_SIZE=2,
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=port,
                HOOKED_HARVEST_TIMEOUT_S=120,
            ),
        )
        for r in range(2)
    ]
    try:
        errors = [p.communicate(timeout=240)[1] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=30)
    assert [p.returncode for p in procs] == [0, 0], [e[-2000:] for e in errors]
    per_rank = [json.loads((out / f"manifest-rank{r:03d}.json").read_text())["shards"] for r in range(2)]
    assert [s["index"] % 2 for s in per_rank[0]] == [0] * len(per_rank[0]) and per_rank[0]
    assert [s["index"] % 2 for s in per_rank[1]] == [1] * len(per_rank[1]) and per_rank[1]
    assert {s["file"][:10] for s in per_rank[1]} == {"shard-001-"}
    merged = json.loads((out / "manifest.json").read_text())
    assert merged["complete"] and merged["world_size"] == 2
    assert [s["index"] for s in merged["shards"]] == [s["index"] for s in single["shards"]]
    assert_same_harvest(tmp_path / "one", out)
