"""The torch.distributed pipeline on NCCL: as many ranks as visible GPUs (one per GPU), spawned with torchrun on
127.0.0.1, against the plain model on the same GPU. With one GPU the world has one rank: NCCL's collectives
(the broadcasts and all-gathers every pipelined call makes) run; point-to-point sends need >= 2 GPUs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from tests.integration.test_pipeline import ROOT, _free_port
from tests.tiny_models import tiny_hf

WORKER = Path(__file__).with_name("nccl_worker.py")


def test_pipeline_on_nccl_matches_the_plain_model(tmp_path):
    checkpoint = tmp_path / "ckpt"
    tiny_hf("Llama", num_key_value_heads=2, num_hidden_layers=4).save_pretrained(checkpoint)
    world = min(torch.cuda.device_count(), 4)
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(world),
        "--master-addr", "127.0.0.1", "--master-port", str(_free_port()), str(WORKER), str(checkpoint), str(tmp_path),
    ]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-4000:]
    for rank in range(world):
        report = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert report["backend"] == "nccl" and report["world"] == world, report
        assert report["device"] == f"cuda:{rank}" and report["logits_device"] == f"cuda:{rank}", report
        assert all(value <= 1e-6 for value in report["diffs"].values()), report
        assert report["same_greedy_tokens"], report
