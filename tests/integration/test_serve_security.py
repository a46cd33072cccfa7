"""`hooked serve` refuses what it should, with a 4xx, before allocating, and keeps serving.

Raw HTTP requests (httpx) against a tiny GPT-2 served from a thread on 127.0.0.1.
"""

from __future__ import annotations

import json
import pickle
import random
import struct

import httpx
import pytest
import torch

from hooked import HookedTransformer
from hooked.cli import main
from hooked.serve import ServeOptions, start_in_thread
from hooked.serve.ops import ServeLimits
from hooked.serve.wire import CONTENT_TYPE, Limits, encode
from tests.integration.serve_models import TOKENS, save_tiny

ALICE = {"authorization": f"Bearer {TOKENS['alice']}", "content-type": CONTENT_TYPE}
BOB = {"authorization": f"Bearer {TOKENS['bob']}", "content-type": CONTENT_TYPE}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    model = HookedTransformer.from_pretrained(str(save_tiny("gpt2", tmp_path_factory.mktemp("gpt2"))))
    options = ServeOptions(limits=ServeLimits(max_tokens_per_request=256), wire=Limits(max_body_bytes=2**20))
    srv = start_in_thread(model, tokens=TOKENS, options=options)
    with httpx.Client(base_url=srv.url, timeout=30) as http:
        yield http
    srv.stop()


def _ok_body(**extra) -> bytes:
    return encode({"op": "forward", **extra}, {"tokens": torch.tensor([[1, 2, 3]])})


def _still_serving(http) -> None:
    r = http.post("/v1/run", content=_ok_body(), headers=ALICE)
    assert r.status_code == 200, r.text


@pytest.mark.parametrize(
    "headers,status",
    [
        ({}, 401),
        ({"authorization": "Bearer wrong-token-000000000000"}, 401),
        ({"authorization": f"Basic {TOKENS['alice']}"}, 401),
        ({"authorization": f"Bearer {TOKENS['alice'][:-1]}"}, 401),
    ],
)
def test_missing_or_wrong_token_is_401(server, headers, status):
    for method, path in (
        ("GET", "/v1/model"),
        ("POST", "/v1/run"),
        ("GET", "/v1/weights/unembed"),
        ("GET", "/inspect"),
    ):
        r = server.request(method, path, headers={"content-type": CONTENT_TYPE, **headers}, content=_ok_body())
        assert r.status_code == status, (path, r.text)
    assert server.get("/health").status_code == 200


def test_another_users_job_is_403(server):
    r = server.post("/v1/run", content=_ok_body(), headers=ALICE)
    job = r.headers["x-job-id"]
    assert server.get(f"/v1/jobs/{job}", headers=ALICE).json()["state"] == "done"
    assert server.get(f"/v1/jobs/{job}", headers=BOB).status_code == 403
    assert server.delete(f"/v1/jobs/{job}", headers=BOB).status_code == 403
    assert server.get("/v1/jobs/no-such-job", headers=BOB).status_code == 404


EVIL = [
    {
        "op": "forward",
        "hooks": [{"name": "blocks.0.hook_resid_pre", "hook": {"op": "__import__('os').system('true')"}}],
    },
    {"op": "forward", "hooks": [{"name": "__import__('os')", "hook": {"op": "zero_ablate"}}]},
    {"op": "forward", "hooks": [{"name": "../../etc/passwd", "hook": {"op": "zero_ablate"}}]},
    {"op": "forward", "hooks": [{"name": "blocks.0.hook_resid_pre", "hook": {"op": "zero_ablate", "heads": "1+1"}}]},
    {"op": "forward", "hooks": [{"name": "blocks.0.hook_resid_pre", "hook": {"op": "scale", "factor": "eval('2')"}}]},
    {
        "op": "forward",
        "hooks": [{"name": "blocks.0.hook_resid_pre", "hook": {"op": "chain", "items": [{"op": "os.system"}]}}],
    },
    {"op": "forward", "cache": ["os.path"]},
    {"op": "forward", "cache": "lambda n: True"},
    {"op": "subprocess.run"},
    {"op": "forward", "__reduce__": "os.system"},
    {"op": "patch", "function": "os.system", "metric": {"op": "logit_diff", "correct": [1], "incorrect": [2]}},
    {
        "op": "patch",
        "setter": "builtins.eval",
        "activation": "resid_pre",
        "axes": ["layer"],
        "metric": {"op": "log_prob", "token": 1},
    },
    {"op": "patch", "function": "get_act_patch_resid_pre", "metric": {"op": "pickle.loads"}},
    {"op": "attribution", "names": ["importlib.import_module"], "metric": {"op": "log_prob", "token": 1}},
]


@pytest.mark.parametrize("body", EVIL, ids=range(len(EVIL)))
def test_code_paths_and_imports_in_a_request_are_refused(server, body):
    tensors = {"tokens": torch.tensor([[1, 2, 3]]), "clean_tokens": torch.tensor([[1, 2, 4]])}
    if body["op"] == "forward":
        tensors.pop("clean_tokens")
    r = server.post("/v1/run", content=encode(body, tensors), headers=ALICE)
    assert 400 <= r.status_code < 500 and r.status_code not in (401, 403), r.text
    _still_serving(server)


def test_a_pickle_is_refused(server):
    payload = pickle.dumps({"op": "forward"})
    for content in (payload, encode({"op": "forward"}, {}) + payload):
        r = server.post("/v1/run", content=content, headers=ALICE)
        assert r.status_code == 400, r.text
    r = server.get("/v1/weights/..%2F..%2Fetc%2Fpasswd", headers=ALICE)
    assert 400 <= r.status_code < 500
    _still_serving(server)


def _header_only(entries: dict, payload: bytes = b"", meta: dict | None = None) -> bytes:
    header = dict(entries)
    header["__metadata__"] = {"json": json.dumps(meta or {"op": "forward"})}
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + payload


def _raw_header(raw: bytes) -> bytes:
    return struct.pack("<Q", len(raw)) + raw


def _raw_meta(body_json: str) -> bytes:
    """A message whose JSON body is `body_json` verbatim (and one token tensor)."""
    header = {"tokens": {"dtype": "I64", "shape": [1, 1], "data_offsets": [0, 8]}, "__metadata__": {"json": body_json}}
    return _raw_header(json.dumps(header).encode()) + struct.pack("<q", 1)


def test_oversized_tensors_and_too_many_tokens_are_refused_before_allocation(server):
    huge = _header_only({"tokens": {"dtype": "I64", "shape": [2**31, 2**31], "data_offsets": [0, 8]}}, b"\0" * 8)
    assert server.post("/v1/run", content=huge, headers=ALICE).status_code == 413
    claims = _header_only({"tokens": {"dtype": "F32", "shape": [10**9], "data_offsets": [0, 4 * 10**9]}})
    assert server.post("/v1/run", content=claims, headers=ALICE).status_code == 413
    big_body = b"\0" * (2**20 + 10)
    assert server.post("/v1/run", content=big_body, headers=ALICE).status_code == 413
    too_many = encode({"op": "forward"}, {"tokens": torch.ones(8, 40, dtype=torch.long)})
    assert server.post("/v1/run", content=too_many, headers=ALICE).status_code == 413
    long_gen = encode({"op": "generate", "max_new_tokens": 200}, {"tokens": torch.ones(2, 10, dtype=torch.long)})
    assert server.post("/v1/stream", content=long_gen, headers=ALICE).status_code in (413, 422)
    _still_serving(server)


def _fuzz_bodies(rng: random.Random) -> list[bytes]:
    good = encode(
        {
            "op": "forward",
            "hooks": [{"name": "blocks.0.hook_resid_pre", "hook": {"op": "add", "tensor": "h0.0", "scale": 1.0}}],
        },
        {"tokens": torch.tensor([[1, 2, 3]]), "h0.0": torch.ones(64)},
    )
    bodies = [good[:n] for n in (0, 4, 8, 9, 20, len(good) // 2, len(good) - 1)]  # truncated
    bodies += [good[:8] + bytes(rng.randrange(256) for _ in range(40)) for _ in range(5)]  # garbage header
    flips = []
    for _ in range(20):  # random byte flips in the header
        b = bytearray(good)
        i = rng.randrange(8, 8 + struct.unpack("<Q", good[:8])[0])
        b[i] = rng.randrange(256)
        flips.append(bytes(b))
    bodies += flips
    bodies += [
        encode({"op": "forward"}, {"tokens": torch.tensor([[1.0, 2.0]])}),  # float tokens
        encode({"op": "forward"}, {"tokens": torch.tensor([[1, 2, 10**6]])}),  # out of vocabulary
        encode({"op": "forward"}, {"tokens": torch.tensor([[-1, 2]])}),
        encode({"op": "forward"}, {"tokens": torch.ones(2, 3, 4, dtype=torch.long)}),  # wrong rank
        encode({"op": "forward"}, {"tokens": torch.zeros(0, 3, dtype=torch.long)}),  # empty
        encode({"op": "forward"}, {"tokens": torch.ones(1, 100, dtype=torch.long)}),  # longer than n_ctx
        encode(
            {"op": "forward", "hooks": [{"name": "blocks.0.hook_resid_pre", "hook": {"op": "add", "tensor": "h0.0"}}]},
            {"tokens": torch.tensor([[1, 2]]), "h0.0": torch.tensor([float("nan")] * 64)},
        ),  # NaN
        encode(
            {"op": "forward", "hooks": [{"name": "blocks.0.hook_resid_pre", "hook": {"op": "add", "tensor": "h0.0"}}]},
            {"tokens": torch.tensor([[1, 2]]), "h0.0": torch.ones(63)},
        ),  # wrong shape: fails in the hook
        encode(
            {"op": "forward", "hooks": [{"name": "blocks.0.hook_resid_pre", "hook": {"op": "add", "tensor": "h0.0"}}]},
            {"tokens": torch.tensor([[1, 2]]), "h0.0": torch.ones(64, dtype=torch.int32)},
        ),  # int tensor
        encode({"op": "forward"}, {"tokens": torch.tensor([[1, 2]]), "attention_mask": torch.tensor([[2, 1]])}),
        encode(
            {
                "op": "forward",
                "hooks": [{"name": "blocks.0.attn.hook_z", "hook": {"op": "zero_ablate", "heads": [99]}}],
            },
            {"tokens": torch.tensor([[1, 2]])},
        ),
        encode({"op": "forward", "x": json.loads("[" * 10 + "]" * 10)}, {"tokens": torch.tensor([[1]])}),
        _raw_meta('{"op": "forward", "deep": ' + "[" * 5000 + "]" * 5000 + "}"),  # deep JSON body
        _raw_header(b'{"x": ' + b"[" * 5000 + b"]" * 5000 + b"}"),  # deep safetensors header
        _header_only({"tokens": {"dtype": "O", "shape": [1], "data_offsets": [0, 8]}}, b"\0" * 8),  # object dtype
        _header_only({"tokens": {"dtype": "I64", "shape": [-1], "data_offsets": [0, 8]}}, b"\0" * 8),
        _header_only({"tokens": {"dtype": "I64", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 8),  # size mismatch
        _header_only(
            {
                "a": {"dtype": "I64", "shape": [1], "data_offsets": [0, 8]},
                "b": {"dtype": "I64", "shape": [1], "data_offsets": [0, 8]},
            },
            b"\0" * 8,
        ),  # overlap
        struct.pack("<Q", 2**63) + b"{}",
        _raw_meta('{"op": "generate", "seed": ' + "9" * 5000 + "}"),  # an int too long to convert
        _raw_meta('{"op": "forward", "hooks": NaN}'),
    ]
    return bodies


def test_fuzzed_bodies_get_4xx_and_never_a_500(server):
    rng = random.Random(0)
    statuses = []
    for body in _fuzz_bodies(rng):
        for path in ("/v1/run", "/v1/stream"):
            r = server.post(path, content=body, headers=ALICE)
            if r.status_code == 200 and path == "/v1/stream":  # a stream reports a late failure as its last line
                last = json.loads(r.text.strip().splitlines()[-1])
                statuses.append(last.get("status", 200))
            else:
                statuses.append(r.status_code)
    assert all(s < 500 for s in statuses), statuses
    assert sum(400 <= s < 500 for s in statuses) >= len(statuses) - 4  # a byte flip may land in a harmless place
    _still_serving(server)


def test_binding_all_addresses_without_tokens_is_refused(monkeypatch, capsys):
    monkeypatch.delenv("HOOKED_SERVE_TOKENS", raising=False)
    assert main(["serve", "--host", "0.0.0.0", "--port", "9"]) == 1
    assert "refusing to serve on 0.0.0.0 without authentication" in capsys.readouterr().err
    assert main(["serve", "--host", "0.0.0.0", "--no-auth"]) == 1


def test_status_page_without_a_login_shows_counts_only(server):
    server.post("/v1/run", content=_ok_body(), headers=BOB)
    page = server.get("/").text
    assert "in flight" in page and "users with requests" in page
    assert not any(word in page for word in ("alice", "bob", "Model:", "gpt2", "/tmp"))
    with_token = server.get("/", headers={"authorization": BOB["authorization"]}).text
    assert "bob" in with_token and "Model:" in with_token


def test_a_browser_logs_in_with_a_form_and_gets_a_session_cookie(server):
    with httpx.Client(base_url=str(server.base_url), timeout=30) as browser:
        html_get = {"accept": "text/html"}
        r = browser.get("/inspect?prompt=hi", headers=html_get)
        assert r.status_code == 303 and r.headers["location"] == "/login?next=%2Finspect%3Fprompt%3Dhi"
        assert browser.get("/inspect?prompt=hi").status_code == 401  # an API client gets a 401
        r = browser.post("/login", data={"token": "wrong-token-0123456789", "next": "/"})
        assert r.status_code == 401 and "Unknown token" in r.text
        r = browser.post("/login", data={"token": TOKENS["alice"], "next": "//evil.example/x"})
        assert r.status_code == 303 and r.headers["location"] == "/"  # no open redirect
        cookie = r.headers["set-cookie"].lower()
        assert "httponly" in cookie and "samesite=strict" in cookie and TOKENS["alice"].lower() not in cookie
        assert browser.get("/inspect", params={"prompt": "The quick brown fox"}).status_code == 200
        assert "alice" in browser.get("/").text
        r = browser.post("/v1/run", content=_ok_body(), headers={"content-type": CONTENT_TYPE})
        assert r.status_code == 401  # the API takes a token, never the cookie
        browser.post("/logout")
        assert browser.get("/inspect?prompt=hi").status_code == 401


def test_an_intervention_tensor_that_would_enlarge_its_activation_is_refused(server):
    hook = {"name": "blocks.0.hook_resid_pre", "hook": {"op": "add", "tensor": "h0.0"}}
    for shape in ((4096, 1, 1), (2, 3, 64), (5,)):
        r = server.post(
            "/v1/run", content=encode({"op": "forward", "hooks": [hook]}, {"tokens": torch.tensor([[1, 2, 3]]),
            "h0.0": torch.ones(shape)}), headers=ALICE,
        )  # fmt: skip
        assert r.status_code == 422 and "does not fit the activation (1, 3, 64)" in r.json()["error"], shape
    metric = {"op": "log_prob", "token": 1, "pos": -9}
    body = encode(
        {"op": "patch", "function": "get_act_patch_resid_pre", "metric": metric},
        {"tokens": torch.tensor([[1, 2, 3]]), "clean_tokens": torch.tensor([[1, 2, 4]])},
    )
    r = server.post("/v1/run", content=body, headers=ALICE)
    assert r.status_code == 422 and "position -9" in r.json()["error"]
    _still_serving(server)
