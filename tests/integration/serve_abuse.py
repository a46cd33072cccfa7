"""Hostile and careless clients against `hooked serve`: each probe of issue #40, as a function.

A `hooked serve` subprocess hosts a tiny 2-layer GPT-2 with a 49,152-token vocabulary (8,192
positions) under an address-space cap (`ulimit -v`) and a file limit (`ulimit -n`), bound to
127.0.0.1. Each probe sends what a hostile or careless user would, and returns a `Finding`:
whether the server answered as it should (a 4xx naming the limit, or a correct answer), what
was measured, and whether the server is still alive and answering `/health` afterwards.

`tests/integration/test_serve_abuse.py` runs every probe at `SIZES["test"]` (well under a
minute); `benchmarks/serve_abuse.py` at `SIZES["full"]`, the sizes of the issue, and prints
the table docs/serving.md reports. Every wait has a timeout.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import torch

from hooked import metrics
from hooked.serve import memory
from hooked.serve.wire import CONTENT_TYPE, encode

ROOT = Path(__file__).resolve().parents[2]
MiB = 2**20
TOKENS = {"alice": "alice-token-0123456789", "bob": "bob-token-0123456789ab"}
HEADERS = {user: {"authorization": f"Bearer {t}", "content-type": CONTENT_TYPE} for user, t in TOKENS.items()}
WAIT_S = 120


@dataclass(frozen=True)
class Size:
    """How hard each probe pushes."""

    address_space: int = 6 * 10**9  # the server's `ulimit -v`
    open_files: int = 1024  # the server's `ulimit -n`
    half_open: int = 1100  # connections that never finish their request head
    bodies: int = 16  # finished requests carrying an unused tensor ...
    body_bytes: int = 32 * MiB  # ... of this size
    uploads: int = 16  # parallel uploads ...
    upload_bytes: int = 60 * MiB  # ... of this size
    request_timeout_s: float = 3.0  # the server's --request-timeout
    send_timeout_s: float = 2.0  # the server's --send-timeout


SIZES = {"full": Size(), "test": Size(bodies=16, body_bytes=8 * MiB, upload_bytes=8 * MiB, request_timeout_s=2.0)}


@dataclass
class Finding:
    probe: str
    ok: bool
    answer: str
    numbers: dict = field(default_factory=dict)
    alive: bool = False


def make_checkpoint(directory: Path) -> Path:
    """The probes' model: a tiny GPT-2 with SmolLM2's vocabulary size and 8,192 positions."""
    from tests.tiny_models import make_tokenizer, tiny_gpt2

    if not (directory / "config.json").exists():
        tiny_gpt2(vocab_size=49152, n_positions=8192, bos_token_id=0, eos_token_id=0).save_pretrained(directory)
        make_tokenizer().save_pretrained(directory)
    return directory


def _limits(size: Size):
    import resource

    def apply() -> None:  # in the server's process, before it starts
        resource.setrlimit(resource.RLIMIT_AS, (size.address_space, size.address_space))
        resource.setrlimit(resource.RLIMIT_NOFILE, (size.open_files, size.open_files))

    return apply


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`hooked serve` in a subprocess under the size's limits; its log, memory and health."""

    def __init__(self, checkpoint: Path, size: Size, workdir: Path, *extra: str):
        self.size, self.port = size, _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        tokens = workdir / "tokens.txt"
        tokens.write_text("".join(f"{u} {t}\n" for u, t in TOKENS.items()))
        tokens.chmod(0o644)  # readable by all: the server must warn
        self.log_path = workdir / "server.log"
        cmd = [sys.executable, "-m", "hooked.cli", "serve", "--model", str(checkpoint), "--port", str(self.port)]
        cmd += ["--tokens", str(tokens), "--request-timeout", str(size.request_timeout_s)]
        cmd += ["--send-timeout", str(size.send_timeout_s), *extra]
        env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                                         preexec_fn=_limits(size))  # fmt: skip
        self.http = httpx.Client(base_url=self.url, timeout=WAIT_S)
        deadline = time.monotonic() + WAIT_S
        while not self.healthy(timeout=2):
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.stop()
                raise RuntimeError(f"the server did not start:\n{self.log_path.read_text()[-3000:]}")
            time.sleep(0.2)

    def healthy(self, timeout: float = 10.0) -> bool:
        try:
            return httpx.get(self.url + "/health", timeout=timeout).status_code == 200
        except httpx.HTTPError:
            return False

    def alive(self) -> bool:
        return self.proc.poll() is None and self.healthy()

    def rss(self) -> int:
        return memory.rss_bytes(self.proc.pid) or 0

    def reset_peak(self) -> int:
        """Restart the peak-memory count; the resident memory now (after the server settles)."""
        time.sleep(0.3)
        memory.reset_peak(self.proc.pid)
        return self.rss()

    def peak(self) -> int:
        return memory.peak_rss_bytes(self.proc.pid) or 0

    def post(self, user: str, body: dict, tensors: dict, path: str = "/v1/run") -> httpx.Response:
        return self.http.post(path, content=encode(body, tensors), headers=HEADERS[user])

    def log(self) -> list[dict]:
        lines = self.log_path.read_text().splitlines()
        return [json.loads(x) for x in lines if x.startswith("{")]

    def stop(self) -> None:
        self.http.close()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=WAIT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=WAIT_S)


def _refused(r: httpx.Response, status: int, *words: str) -> tuple[bool, str]:
    text = r.json().get("error", r.text) if r.headers.get("content-type", "").startswith("application/json") else ""
    return r.status_code == status and all(w in text for w in words), f"{r.status_code}: {text[:160]}"


def _tokens(batch: int, pos: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 300, (batch, pos), generator=torch.Generator().manual_seed(seed))


# -- memory: every request bounded before it runs ----------------------------------------------
def probe_ig(server: Server, size: Size) -> Finding:
    """IG with 256 steps on a 128-token prompt: all steps in one forward would take tens of GB."""
    tokens, (metric, _) = _tokens(1, 128), metrics.log_prob(3).to_spec()
    body = {"op": "attribution", "method": "ig", "steps": 256, "names": ["blocks.0.hook_resid_pre"], "metric": metric}
    base = server.reset_peak()
    r = server.post("alice", body, {"tokens": tokens, "clean_tokens": tokens.flip(1)})
    ok, answer = _refused(r, 413, "--max-request-memory", "steps_per_forward")
    return Finding("ig_256_steps", ok, answer, {"peak_growth_mib": (server.peak() - base) / MiB})


def probe_broadcast_add(server: Server, size: Size) -> Finding:
    """An `add` whose tensor [4096, 1, 1] would broadcast the activation [1, 3, 64] to 4096 rows."""
    hook = {"name": "blocks.0.hook_resid_pre", "hook": {"op": "add", "tensor": "h0.0"}}
    base = server.reset_peak()
    r = server.post(
        "alice", {"op": "forward", "hooks": [hook]}, {"tokens": _tokens(1, 3), "h0.0": torch.ones(4096, 1, 1)}
    )
    growth = (server.peak() - base) / MiB
    ok, answer = _refused(r, 422, "does not fit the activation")
    return Finding("broadcast_add", ok and growth < 64, answer, {"peak_growth_mib": growth})


def _active_names(server: Server) -> list[str]:
    info = server.http.get("/v1/model", headers=HEADERS["alice"]).json()
    return [n for n in info["hook_names"] if n not in set(info["inactive"])]


def probe_cache_all_longest(server: Server, size: Size) -> Finding:
    """Every active hook point cached at the longest length a request may have (8,192 tokens)."""
    names = _active_names(server)
    base = server.reset_peak()
    r = server.post("alice", {"op": "forward", "cache": names}, {"tokens": _tokens(1, 8192)})
    ok, answer = _refused(r, 413, "--max-request-memory")
    return Finding("cache_all_8192", ok, answer, {"peak_growth_mib": (server.peak() - base) / MiB})


def probe_inspect_emoji(server: Server, size: Size) -> Finding:
    """`/inspect` of 2,000 emoji: thousands of tokens, attention patterns of their square."""
    base = server.reset_peak()
    r = server.http.get("/inspect", params={"prompt": "\N{GRINNING FACE}" * 2000}, headers=HEADERS["alice"])
    ok, answer = _refused(r, 413, "limit")
    return Finding("inspect_2000_emoji", ok, answer, {"peak_growth_mib": (server.peak() - base) / MiB})


def probe_huge_answer(server: Server, size: Size) -> Finding:
    """A small request (the logits of 8,192 tokens, 1.6 GB) asking for a large answer."""
    body = {"op": "forward"}
    tokens = _tokens(1, 8192)
    r = server.post("alice", body, {"tokens": tokens})
    ok, answer = _refused(r, 413, "limit")
    return Finding("answer_1.6GB", ok, answer, {"request_kib": len(encode(body, {"tokens": tokens})) / 1024})


def probe_metric_position(server: Server, size: Size) -> Finding:
    tokens = _tokens(1, 5)
    body = {"op": "patch", "function": "get_act_patch_resid_pre", "metric": {"op": "log_prob", "token": 1, "pos": 99}}
    r = server.post("alice", body, {"tokens": tokens, "clean_tokens": tokens})
    ok, answer = _refused(r, 422, "position 99")
    return Finding("metric_position_99", ok, answer)


def probe_cache_256_answer(server: Server, size: Size) -> Finding:
    """Every cached activation at 256 positions: a correct answer, and its memory handed back after."""
    names = _active_names(server)
    before = server.reset_peak()
    r = server.post("alice", {"op": "forward", "cache": names}, {"tokens": _tokens(1, 256)})
    peak = server.peak()
    time.sleep(1.0)
    after = server.rss()
    ok = r.status_code == 200 and len(r.content) > 50 * MiB and after - before < 64 * MiB
    numbers = {"answer_mib": len(r.content) / MiB, "peak_growth_mib": (peak - before) / MiB}
    numbers["rss_after_minus_before_mib"] = (after - before) / MiB
    return Finding("cache_all_256_then_trim", ok, f"{r.status_code}", numbers)


# -- nothing kept that is not needed ---------------------------------------------------------------
def probe_finished_bodies(server: Server, size: Size) -> Finding:
    """Requests of a 2-token prompt plus an unused tensor: nothing of them stays once answered."""
    before = server.reset_peak()
    statuses = set()
    unused = torch.zeros(size.body_bytes // 4)
    for i in range(size.bodies):
        statuses.add(server.post("bob", {"op": "forward"}, {"tokens": _tokens(1, 2, i), "h9.0": unused}).status_code)
    time.sleep(1.0)
    growth = (server.rss() - before) / MiB
    numbers = {"requests": size.bodies, "body_mib": size.body_bytes / MiB, "rss_growth_mib": growth}
    return Finding("finished_bodies", statuses == {200} and growth < 300, f"{sorted(statuses)}", numbers)


def probe_parallel_uploads(server: Server, size: Size) -> Finding:
    """One user's parallel large uploads: the in-flight limit applies before a body is read."""
    unused = torch.zeros(size.upload_bytes // 4)
    data = encode({"op": "forward"}, {"tokens": _tokens(1, 2), "h9.0": unused})
    statuses: list[int] = []
    base = server.reset_peak()

    def upload() -> None:
        with httpx.Client(timeout=WAIT_S) as c:
            statuses.append(c.post(server.url + "/v1/run", content=data, headers=HEADERS["bob"]).status_code)

    threads = [threading.Thread(target=upload) for _ in range(size.uploads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT_S)
    growth = (server.peak() - base) / MiB
    bound = (8 * 3 * size.upload_bytes + 128 * MiB) / MiB  # 8 in flight per user, each decoded (x3 at most)
    numbers = {"uploads": size.uploads, "upload_mib": size.upload_bytes / MiB, "peak_growth_mib": growth}
    ok = set(statuses) <= {200, 429} and len(statuses) == size.uploads and growth < bound
    return Finding("parallel_uploads", ok, f"{sorted(statuses)}", numbers)


def _raw_request(server: Server, path: str, data: bytes, user: str) -> socket.socket:
    """A request sent on a socket whose answer is never read."""
    s = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    head = f"POST {path} HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {TOKENS[user]}\r\n"
    head += f"content-type: {CONTENT_TYPE}\r\ncontent-length: {len(data)}\r\n\r\n"
    s.sendall(head.encode() + data)
    return s


def _in_flight(server: Server) -> int:
    page = httpx.get(server.url + "/", timeout=10).text
    return int(page.split("in flight: ")[1].split(";")[0])


def probe_unread_streams(server: Server, size: Size) -> Finding:
    """Two large streamed answers the client never reads: closed after the send timeout, memory released."""
    names = [n for n in _active_names(server) if "hook_pattern" in n or "hook_attn_scores" in n]
    data = encode({"op": "forward", "cache": names}, {"tokens": _tokens(1, 1024)})
    before = server.reset_peak()
    sockets = [_raw_request(server, "/v1/stream", data, "bob") for _ in range(2)]
    time.sleep(0.5)
    held = _in_flight(server)
    deadline = time.monotonic() + size.send_timeout_s + 15
    while _in_flight(server) and time.monotonic() < deadline:
        time.sleep(0.2)
    released_s = size.send_timeout_s + 15 - (deadline - time.monotonic())
    time.sleep(0.5)
    growth = (server.rss() - before) / MiB
    for s in sockets:
        s.close()
    numbers = {
        "in_flight_while_unread": held,
        "released_after_s": released_s,
        "peak_growth_mib": (server.peak() - before) / MiB,
    }
    numbers["rss_growth_after_mib"] = growth
    ok = held >= 2 and _in_flight(server) == 0 and growth < 64
    return Finding("unread_streams", ok, f"in flight {held} -> 0 after {released_s:.1f} s", numbers)


# -- connections ------------------------------------------------------------------------------------
HALF_OPEN = """
import socket, sys, time
port, n, hold = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
held = []
for _ in range(n):
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        s.sendall(b"GET /health HTTP/1.1\\r\\nhost: x\\r\\n")  # never the blank line that ends the head
        held.append(s)
    except OSError:
        pass
print(len(held), flush=True)
time.sleep(hold)
"""


def probe_half_open(server: Server, size: Size) -> Finding:
    """Connections that never finish their request head, more than the server's file limit."""
    attacker = subprocess.Popen(
        [sys.executable, "-c", HALF_OPEN, str(server.port), str(size.half_open), "30"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        opened = int((attacker.stdout.readline() if attacker.stdout else "0") or 0)
        started = time.monotonic()
        healthy = server.healthy(timeout=10)
        health_s = time.monotonic() - started
        user_ok = server.post("bob", {"op": "forward"}, {"tokens": _tokens(1, 4)}).status_code == 200
    finally:
        attacker.kill()
        attacker.wait(timeout=WAIT_S)
    numbers = {"half_open": opened, "server_open_files_limit": size.open_files, "health_s": health_s}
    ok = opened >= size.half_open * 0.9 and healthy and health_s < 10 and user_ok
    return Finding("half_open_connections", ok, f"/health in {health_s:.2f} s, a user's forward: {user_ok}", numbers)


# -- time limits that hold ----------------------------------------------------------------------------
def _forward_s(server: Server, batch: int, pos: int) -> float:
    """Seconds of one forward of [batch, pos] tokens (client-side, logits not sent back)."""
    best = float("inf")
    for _ in range(2):
        started = time.monotonic()
        r = server.post("bob", {"op": "forward", "return_logits": False}, {"tokens": _tokens(batch, pos)})
        assert r.status_code == 200, r.text
        best = min(best, time.monotonic() - started)
    return best


def _deadline_probe(server: Server, size: Size, name: str, request: tuple[dict, dict], unit: tuple) -> Finding:
    """`request` as alice, a forward as bob half a second later: alice's job must end with a 504 within
    one unit of work (`unit`: (batch, pos, forwards), a forward and its backward being 3) past the
    deadline, and bob's forward must be answered. The unit is timed before and after (the machine is
    shared: the slower of the two counts), plus 0.5 s for HTTP and polling."""
    result: dict = {}
    batch, pos, forwards = unit
    forward_s = forwards * _forward_s(server, batch, pos)

    def alice() -> None:
        started = time.monotonic()
        r = server.post("alice", *request)
        result.update(status=r.status_code, elapsed=time.monotonic() - started, text=r.text[:160])

    thread = threading.Thread(target=alice)
    thread.start()
    time.sleep(0.5)
    bob = server.post("bob", {"op": "forward", "return_logits": False}, {"tokens": _tokens(1, 8)})
    thread.join(WAIT_S)
    forward_s = max(forward_s, forwards * _forward_s(server, batch, pos))
    over = result["elapsed"] - size.request_timeout_s
    numbers = {"timeout_s": size.request_timeout_s, "ended_after_s": result["elapsed"], "over_s": over}
    numbers["one_unit_s"] = forward_s
    ok = result["status"] == 504 and over <= forward_s + 0.5 and bob.status_code == 200
    return Finding(name, ok, f"{result['status']}: {result['text'][:80]}; other user: {bob.status_code}", numbers)


def _pattern_sweep(batch_size: int, pos: int) -> tuple[dict, dict]:
    metric, _ = metrics.log_prob(3).to_spec()
    tokens = _tokens(1, pos)
    body = {"op": "patch", "function": "get_act_patch_attn_head_pattern_dest_src_pos", "metric": metric}
    return {**body, "batch_size": batch_size}, {"tokens": tokens, "clean_tokens": tokens.flip(1)}


def probe_named_sweep_deadline(server: Server, size: Size) -> Finding:
    return _deadline_probe(server, size, "named_sweep_deadline", _pattern_sweep(8, 64), (8, 64, 1))


def probe_generic_sweep_deadline(server: Server, size: Size) -> Finding:
    body, tensors = _pattern_sweep(8, 64)
    del body["function"]
    body |= {"setter": "layer_head_dest_src_pos_pattern_patch_setter", "activation": "pattern", "chunk": 100_000}
    body["axes"] = ["layer", "head_index", "dest_pos", "src_pos"]
    return _deadline_probe(server, size, "generic_sweep_chunk_100000", (body, tensors), (8, 64, 1))


def probe_attribution_deadline(server: Server, size: Size) -> Finding:
    metric, _ = metrics.log_prob(3).to_spec()
    tokens = _tokens(1, 128)
    names = ["blocks.0.hook_resid_pre", "blocks.1.hook_resid_pre"]
    body = {"op": "attribution", "method": "ig", "steps": 256, "steps_per_forward": 4, "names": names, "metric": metric}
    tensors = {"tokens": tokens, "clean_tokens": tokens.flip(1)}
    return _deadline_probe(server, size, "attribution_ig_deadline", (body, tensors), (4, 128, 3))


# -- the small ones -------------------------------------------------------------------------------------
def probe_status_page(server: Server, size: Size) -> Finding:
    """The status page without a token: counts, no user names, no model path."""
    page = httpx.get(server.url + "/", timeout=10).text
    leaks = [w for w in (*TOKENS, "ckpt", "/tmp", *TOKENS.values()) if w in page]
    return Finding("status_page_anonymous", not leaks and "in flight" in page, f"leaks: {leaks}")


def probe_tokens_file_warning(server: Server, size: Size) -> Finding:
    warned = [e for e in server.log() if e.get("level") == "WARNING" and "readable by everyone" in e.get("msg", "")]
    return Finding("world_readable_tokens_warned", bool(warned), (warned or [{"msg": "no warning"}])[0]["msg"][:100])


def probe_duplicate_token(server: Server, size: Size) -> Finding:
    """A tokens file giving one token to two users is refused at start."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "tokens.txt"
        path.write_text("alice shared-token-0123456789\nbob shared-token-0123456789\n")
        path.chmod(0o600)
        cmd = [sys.executable, "-m", "hooked.cli", "serve", "--model", "unused", "--tokens", str(path), "--port", "9"]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=WAIT_S, cwd=ROOT,
                              env=dict(os.environ, PYTHONPATH=str(ROOT)))  # fmt: skip
    ok = done.returncode == 1 and "same token" in done.stderr
    return Finding("duplicate_token_refused", ok, done.stderr.strip().splitlines()[-1][:120] if done.stderr else "")


PROBES = {
    f.__name__.removeprefix("probe_"): f
    for f in (
        probe_ig,
        probe_broadcast_add,
        probe_cache_all_longest,
        probe_inspect_emoji,
        probe_huge_answer,
        probe_metric_position,
        probe_cache_256_answer,
        probe_finished_bodies,
        probe_parallel_uploads,
        probe_unread_streams,
        probe_half_open,
        probe_named_sweep_deadline,
        probe_generic_sweep_deadline,
        probe_attribution_deadline,
        probe_status_page,
        probe_tokens_file_warning,
        probe_duplicate_token,
    )
}


def run_probe(server: Server, size: Size, name: str) -> Finding:
    finding = PROBES[name](server, size)
    finding.alive = server.alive()
    return finding
