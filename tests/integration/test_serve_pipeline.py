"""`hooked serve --pipeline`: a tiny GQA Llama split over 2 gloo ranks on 127.0.0.1; rank 0 answers HTTP
and every rank runs each request. Client answers equal the single-process local model's."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import torch

from hooked import HookedTransformer, metrics, remote
from hooked import interventions as iv
from hooked.analysis import patching
from tests.integration.serve_models import TOKENS, save_tiny

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
WAIT_S = 120


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("pipeline")
    checkpoint = save_tiny("llama_gqa", root / "ckpt")
    http_port, dist_port = _free_port(), _free_port()
    procs, logs = [], []
    for rank in range(2):
        env = dict(
            os.environ,
            RANK=str(rank),
            WORLD_SIZE="2",
            LOCAL_RANK=str(rank),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(dist_port),
            PYTHONPATH=str(ROOT),
            CUDA_VISIBLE_DEVICES="",
            OMP_NUM_THREADS="1",
            HOOKED_SERVE_TOKENS="\n".join(f"{u} {t}" for u, t in TOKENS.items()),
        )
        logs.append(open(root / f"rank{rank}.log", "w"))  # noqa: SIM115 - closed once the servers exit
        cmd = [
            sys.executable,
            "-m",
            "hooked.cli",
            "serve",
            "--pipeline",
            "--model",
            str(checkpoint),
            "--port",
            str(http_port),
        ]
        procs.append(subprocess.Popen(cmd, env=env, stdout=logs[-1], stderr=subprocess.STDOUT, cwd=ROOT))
    url = f"http://127.0.0.1:{http_port}"
    deadline = time.monotonic() + WAIT_S
    while True:
        try:
            if httpx.get(url + "/health", timeout=5).status_code == 200:
                break
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
            for p in procs:
                p.kill()
            pytest.fail("the pipeline server did not start:\n" + (root / "rank0.log").read_text()[-3000:])
        time.sleep(0.2)
    try:
        yield HookedTransformer.from_pretrained(str(checkpoint)), url, procs
    finally:
        procs[0].send_signal(signal.SIGTERM)
        codes = []
        for p in procs:
            try:
                codes.append(p.wait(timeout=WAIT_S))
            except subprocess.TimeoutExpired:
                p.kill()
                codes.append("killed")
        for log in logs:
            log.close()
        assert "killed" not in codes, (root / "rank1.log").read_text()[-3000:]


def test_pipeline_server_answers_equal_the_local_model(served):
    local, url, _ = served
    prompts = ["The quick brown fox jumps", "When Mary and John went"]
    with remote.connect(url, token=TOKENS["alice"]) as client:
        tokens = local.to_tokens(prompts)
        torch.testing.assert_close(client(tokens), local(tokens), rtol=0, atol=1e-6)
        hooks = [
            ("blocks.0.attn.hook_z", iv.zero_ablate(heads=[1])),
            ("blocks.1.hook_resid_pre", iv.add(torch.ones(local.cfg.d_model), scale=0.5, positions=[-1])),
        ]
        torch.testing.assert_close(
            client.run_with_hooks(tokens, fwd_hooks=hooks),
            local.run_with_hooks(tokens, fwd_hooks=hooks),
            rtol=0,
            atol=1e-6,
        )
        (_, cr), (_, cl) = client.run_with_cache(tokens), local.run_with_cache(tokens)
        torch.testing.assert_close(
            cr.decompose_resid(apply_ln=True), cl.decompose_resid(apply_ln=True), rtol=0, atol=1e-6
        )  # weights fetched from the rank that owns each block
        kw = dict(max_new_tokens=5, do_sample=False, verbose=False, stop_at_eos=False)
        assert client.generate(prompts[0], **kw) == local.generate(prompts[0], **kw)
        clean = local.to_tokens(prompts[0])
        corrupted = torch.cat([clean[:, :1], clean[:, 1:].flip(1)], dim=1)
        metric = metrics.logit_diff([5], [7])
        got = patching.get_act_patch_resid_pre(
            client, corrupted, client.run_with_cache(clean)[1], metric, verbose=False
        )
        expected = patching.get_act_patch_resid_pre(
            local, corrupted, local.run_with_cache(clean)[1], metric, verbose=False
        )
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)
