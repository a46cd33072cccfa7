"""docs/scaling-out.md: its torchrun example (```python pipeline_demo.py) runs as written, with 2 gloo
ranks on 127.0.0.1."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.integration.test_pipeline import ROOT, _free_port

pytestmark = pytest.mark.slow


def test_readme_torchrun_example_runs_on_two_ranks(tmp_path):
    page = (ROOT / "docs" / "scaling-out.md").read_text()
    (block,) = re.findall(r"```python pipeline_demo\.py\n(.*?)```", page, flags=re.S)
    script = tmp_path / "pipeline_demo.py"
    script.write_text(block)
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2",
        "--master-addr", "127.0.0.1", "--master-port", str(_free_port()), str(script),
    ]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(ROOT), CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    done = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    assert done.stdout.count("torch.Size(") == 1, done.stdout  # rank 0 prints once
    assert done.stdout.startswith("The capital of France is"), done.stdout
    diff, n_components = re.search(r" (\S+) torch\.Size\(\[(\d+), 2[,\]]", done.stdout).groups()
    assert float(diff) > 0  # the ablation changed the logits
    assert int(n_components) > 2  # embeddings plus every attention and MLP layer
