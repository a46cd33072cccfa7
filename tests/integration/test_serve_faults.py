"""Faults: a client killed mid-request, failing requests, timeouts and SIGTERM leave the server serving
(or, for SIGTERM, finish in-flight work before exiting). Servers run on 127.0.0.1; every wait is bounded."""

from __future__ import annotations

import json
import logging
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
from hooked.core.errors import RemoteError
from hooked.serve import SchedulerOptions, ServeOptions, start_in_thread
from hooked.serve.wire import CONTENT_TYPE, encode
from tests.integration.serve_models import TOKENS, save_tiny

ROOT = Path(__file__).resolve().parents[2]
ALICE = {"authorization": f"Bearer {TOKENS['alice']}", "content-type": CONTENT_TYPE}
WAIT_S = 60


def _long_sweep_body(tokens: torch.Tensor) -> bytes:
    """A pattern sweep over every (layer, head, dest, src): thousands of forwards, progress every 16."""
    metric, _ = metrics.log_prob(3).to_spec()
    body = {
        "op": "patch",
        "setter": "layer_head_dest_src_pos_pattern_patch_setter",
        "activation": "pattern",
        "axes": ["layer", "head_index", "dest_pos", "src_pos"],
        "metric": metric,
        "batch_size": 1,
        "chunk": 16,
    }
    return encode(body, {"tokens": tokens, "clean_tokens": tokens.flip(1)})


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return save_tiny("gpt2", tmp_path_factory.mktemp("gpt2"))


@pytest.fixture(scope="module")
def server(checkpoint):
    model = HookedTransformer.from_pretrained(str(checkpoint))
    srv = start_in_thread(model, tokens=TOKENS, options=ServeOptions(scheduler=SchedulerOptions(request_timeout_s=20)))
    yield srv
    srv.stop()


CLIENT = """
import sys, httpx
url, token, body = sys.argv[1], sys.argv[2], open(sys.argv[3], 'rb').read()
headers = {'authorization': 'Bearer ' + token, 'content-type': 'application/vnd.hooked+safetensors'}
with httpx.stream('POST', url + '/v1/stream', content=body, timeout=60, headers=headers) as r:
    for line in r.iter_lines():
        print(line, flush=True)
"""


def test_a_client_killed_mid_request_leaves_others_unaffected(server, tmp_path):
    tokens = torch.arange(1, 25)[None]
    (tmp_path / "body").write_bytes(_long_sweep_body(tokens))
    proc = subprocess.Popen(
        [sys.executable, "-c", CLIENT, server.url, TOKENS["alice"], str(tmp_path / "body")],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        job = json.loads(proc.stdout.readline())["job"]
        assert "progress" in json.loads(proc.stdout.readline())  # running
        proc.kill()
    finally:
        proc.kill()
        proc.wait(timeout=WAIT_S)
    bob = remote.connect(server.url, token=TOKENS["bob"])
    assert bob(torch.tensor([[1, 2, 3]])).shape == (1, 3, 300)  # others keep being served
    with httpx.Client(base_url=server.url, timeout=10) as http:
        deadline = time.monotonic() + WAIT_S
        while http.get(f"/v1/jobs/{job}", headers=ALICE).json()["state"] != "failed":  # cancelled at its next chunk
            assert time.monotonic() < deadline, "the killed client's job was never cancelled"
            time.sleep(0.05)
    assert bob(torch.tensor([[4, 5]])).shape == (1, 2, 300)
    bob.close()


def test_failing_requests_get_a_clear_4xx_and_the_server_keeps_serving(server):
    client = remote.connect(server.url, token=TOKENS["alice"])
    from hooked.analysis import interventions as iv

    with pytest.raises(RemoteError, match="no hook point") as e:
        client.run_with_hooks(torch.tensor([[1, 2]]), fwd_hooks=[("blocks.9.hook_resid_pre", iv.zero_ablate())])
    assert e.value.status == 422
    with pytest.raises(RemoteError, match="blocks.0.hook_resid_pre") as e:  # a steering vector of the wrong size
        client.run_with_hooks(torch.tensor([[1, 2]]), fwd_hooks=[("blocks.0.hook_resid_pre", iv.add(torch.ones(7)))])
    assert e.value.status == 422
    with pytest.raises(RemoteError, match="out of range"):
        client.run_with_hooks(
            torch.tensor([[1, 2]]), fwd_hooks=[("blocks.0.hook_resid_pre", iv.zero_ablate(positions=[5]))]
        )
    assert client(torch.tensor([[1, 2]])).shape == (1, 2, 300)
    client.close()


def test_a_job_past_the_request_timeout_gets_504(checkpoint):
    model = HookedTransformer.from_pretrained(str(checkpoint))
    options = ServeOptions(scheduler=SchedulerOptions(request_timeout_s=0.5), drain_timeout_s=5)
    with (
        start_in_thread(model, tokens=TOKENS, options=options) as srv,
        httpx.Client(base_url=srv.url, timeout=30) as http,
    ):
        r = http.post("/v1/run", content=_long_sweep_body(torch.arange(1, 25)[None]), headers=ALICE)
        assert r.status_code == 504 and "timeout" in r.json()["error"]
        assert (
            http.post(
                "/v1/run", content=encode({"op": "forward"}, {"tokens": torch.tensor([[1]])}), headers=ALICE
            ).status_code
            == 200
        )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow  # starts `hooked serve` in a subprocess (imports torch, loads the checkpoint)
def test_sigterm_drains_in_flight_requests(checkpoint, tmp_path):
    port = _free_port()
    env = dict(os.environ, HOOKED_SERVE_TOKENS=f"alice {TOKENS['alice']}", PYTHONPATH=str(ROOT))
    log = open(tmp_path / "server.log", "w")  # noqa: SIM115 - closed in the `finally` below, after the server exits
    proc = subprocess.Popen(
        [sys.executable, "-m", "hooked.cli", "serve", "--model", str(checkpoint), "--port", str(port)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=ROOT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(base_url=url, timeout=WAIT_S) as http:
            deadline = time.monotonic() + WAIT_S
            while True:
                try:
                    if http.get("/health").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert time.monotonic() < deadline and proc.poll() is None, (tmp_path / "server.log").read_text()
                time.sleep(0.1)
            tokens = torch.arange(1, 11)[None]
            lines = []
            with http.stream("POST", "/v1/stream", content=_long_sweep_body(tokens), headers=ALICE) as r:
                for line in r.iter_lines():
                    lines.append(json.loads(line))
                    if len(lines) == 2:
                        proc.send_signal(signal.SIGTERM)  # mid-sweep
            assert "result" in lines[-1], lines[-1]
        assert proc.wait(timeout=WAIT_S) in (0, -signal.SIGTERM)  # uvicorn re-raises SIGTERM once it has drained
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=WAIT_S)
        log.close()
    entries = [json.loads(x) for x in (tmp_path / "server.log").read_text().splitlines() if x.startswith("{")]
    assert any(e.get("msg") == "request" and e.get("user") == "alice" and e.get("request_id") for e in entries)
    assert any(e.get("msg") == "shutdown" and e.get("drained") is True for e in entries)
    assert TOKENS["alice"] not in (tmp_path / "server.log").read_text()  # no secrets in the logs
    text = (tmp_path / "server.log").read_text()
    assert "Traceback" not in text and all(  # JSON lines only, besides the two lines printed at start
        x.startswith("{") or x.startswith(("Serving ", "Loaded ")) for x in text.splitlines() if x.strip()
    ), text[-2000:]


def test_compatible_requests_of_different_users_are_batched(checkpoint):
    """With max_batch > 1, plain forwards of equal length queued behind a long job share one forward;
    on this tiny model the batched rows are bitwise equal to single forwards."""
    import threading

    model = HookedTransformer.from_pretrained(str(checkpoint))
    local = HookedTransformer.from_pretrained(str(checkpoint))
    tokens = {"carol": "carol-token-0123456789", **TOKENS}
    options = ServeOptions(scheduler=SchedulerOptions(max_batch=4))
    with (
        start_in_thread(model, tokens=tokens, options=options) as srv,
        httpx.Client(base_url=srv.url, timeout=60) as http,
    ):
        clients = {user: remote.connect(srv.url, token=token) for user, token in tokens.items()}  # connected first
        blocker = threading.Thread(
            target=lambda: http.post("/v1/run", content=_long_sweep_body(torch.arange(1, 17)[None]), headers=ALICE)
        )
        blocker.start()
        time.sleep(0.3)  # the sweep (2048 patches) is running: the forwards below queue behind it
        inputs = {
            user: torch.randint(0, 300, (2, 6), generator=torch.Generator().manual_seed(i))
            for i, user in enumerate(tokens)
        }
        results = {}

        def ask(user):
            results[user] = clients[user](inputs[user])

        askers = [threading.Thread(target=ask, args=(u,)) for u in tokens]
        for t in askers:
            t.start()
        for t in [blocker, *askers]:
            t.join(timeout=WAIT_S)
        for client in clients.values():
            client.close()
        assert srv.app.state.scheduler.snapshot()["users"]["*"]["batched_jobs"] >= 2
        for user in tokens:
            assert torch.equal(results[user], local(inputs[user])), user


def test_the_owner_can_cancel_a_running_job(server, caplog):
    with (
        caplog.at_level(logging.INFO, logger="hooked.serve"),
        httpx.Client(base_url=server.url, timeout=WAIT_S) as http,
    ):
        lines = []
        with http.stream("POST", "/v1/stream", content=_long_sweep_body(torch.arange(1, 25)[None]), headers=ALICE) as r:
            for line in r.iter_lines():
                lines.append(json.loads(line))
                if len(lines) == 2:
                    assert http.delete(f"/v1/jobs/{lines[0]['job']}", headers=ALICE).json()["cancelled"] is True
        assert lines[-1]["status"] == 499 and "cancelled" in lines[-1]["error"]
        assert http.get(f"/v1/jobs/{lines[0]['job']}", headers=ALICE).json()["state"] == "failed"
    logged = [r for r in caplog.records if getattr(r, "job_ids", None) == [lines[0]["job"]]]
    assert [r.getMessage() for r in logged] == ["cancelled"]  # not "ran"


def test_shutdown_answers_what_it_cannot_finish_with_503_and_says_so(checkpoint, caplog):
    """Past the grace period, the running sweep stops and the queued request fails, each with a `hooked`
    503 ("shutting down"), logged by id; the shutdown line says `drained: false`."""
    import threading

    model = HookedTransformer.from_pretrained(str(checkpoint))
    srv = start_in_thread(model, tokens=TOKENS, options=ServeOptions(drain_timeout_s=1.0))
    lines, answers = [], {}

    def alice():
        with httpx.Client(base_url=srv.url, timeout=WAIT_S) as http:
            body = _long_sweep_body(torch.arange(1, 25)[None])
            with http.stream("POST", "/v1/stream", content=body, headers=ALICE) as r:
                lines.extend(json.loads(line) for line in r.iter_lines())

    def bob():
        bob_headers = {**ALICE, "authorization": f"Bearer {TOKENS['bob']}"}
        body = encode({"op": "forward"}, {"tokens": torch.tensor([[1, 2]])})
        answers["bob"] = httpx.post(srv.url + "/v1/run", content=body, headers=bob_headers, timeout=WAIT_S)

    threads = [threading.Thread(target=alice), threading.Thread(target=bob)]
    with caplog.at_level(logging.INFO, logger="hooked.serve"):
        threads[0].start()
        deadline = time.monotonic() + WAIT_S
        while not any("progress" in line for line in lines) and time.monotonic() < deadline:
            time.sleep(0.05)  # the sweep is running ...
        threads[1].start()
        time.sleep(0.3)  # ... and bob's forward waits behind it
        srv.stop()
        for t in threads:
            t.join(WAIT_S)
    assert lines[-1]["status"] == 503 and "shutting down" in lines[-1]["error"], lines[-1]
    assert answers["bob"].status_code == 503 and "shutting down" in answers["bob"].json()["error"]
    stopped = [r.job_ids[0] for r in caplog.records if r.getMessage() == "stopped at shutdown" and r.job_ids]
    assert lines[0]["job"] in stopped and len(stopped) == 2
    (shutdown,) = [r for r in caplog.records if r.getMessage() == "shutdown"]
    assert shutdown.drained is False and set(shutdown.job_ids) == set(stopped)
