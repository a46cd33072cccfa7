"""Every operation of `hooked serve`, its admission estimate against the memory it really took.

For each case, the server subprocess (`serve_abuse.Server`) hands freed memory back, its peak
resident set is reset (`/proc/<pid>/clear_refs`), the request is sent, and the peak's growth
over the resident set before is compared with the estimate the server made before running it
(`GET /v1/jobs/{id}`). The estimate must be an upper bound: `tests/integration/test_serve_costs.py`
checks it on the tiny model; `benchmarks/serve_costs.py` prints the table of docs/serving.md.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

import httpx
import torch

from hooked import metrics
from tests.integration.serve_abuse import HEADERS, MiB, Server, _tokens


@dataclass(frozen=True)
class Case:
    """One request: `send(server, scale)` returns the response (its job id in `x-job-id`)."""

    name: str
    send: Callable[[Server, int], httpx.Response]


@dataclass
class Measured:
    case: str
    status: int
    estimate_mib: float
    peak_mib: float
    answer_mib: float

    @property
    def ratio(self) -> float:
        """Peak over estimate: at most 1 when the estimate is an upper bound."""
        return self.peak_mib / self.estimate_mib


def _forward(server: Server, scale: int, **body) -> httpx.Response:
    return server.post("alice", {"op": "forward", **body}, {"tokens": _tokens(2, 64 * scale)})


def _cache_all(server: Server, scale: int) -> httpx.Response:
    info = server.http.get("/v1/model", headers=HEADERS["alice"]).json()
    names = [n for n in info["hook_names"] if n not in set(info["inactive"])]
    return server.post("alice", {"op": "forward", "cache": names}, {"tokens": _tokens(1, 64 * scale)})


def _hooks(server: Server, scale: int) -> httpx.Response:
    tokens = _tokens(2, 32 * scale)
    hooks = [
        {"name": "blocks.0.hook_resid_post", "hook": {"op": "add", "tensor": "h0.0", "scale": 2.0}},
        {"name": "blocks.1.attn.hook_pattern", "hook": {"op": "zero_ablate", "heads": [0]}},
    ]
    d_model = server.http.get("/v1/model", headers=HEADERS["alice"]).json()["cfg"]["d_model"]
    return server.post("alice", {"op": "forward", "hooks": hooks}, {"tokens": tokens, "h0.0": torch.ones(d_model)})


def _generate(server: Server, scale: int, **options) -> httpx.Response:
    body = {"op": "generate", "max_new_tokens": 16 * scale, "do_sample": False, "stop_at_eos": False, **options}
    return server.post("alice", body, {"tokens": _tokens(2, 16 * scale)}, path="/v1/stream")


def _patch(server: Server, scale: int, **body) -> httpx.Response:
    metric, _ = metrics.log_prob(3).to_spec()
    tokens = _tokens(1, 8 * scale)
    return server.post(
        "alice", {"op": "patch", "metric": metric, **body}, {"tokens": tokens, "clean_tokens": tokens.flip(1)}
    )


def _attribution(server: Server, scale: int, **body) -> httpx.Response:
    metric, _ = metrics.log_prob(3).to_spec()
    tokens = _tokens(2, 32 * scale)
    names = ["blocks.0.hook_resid_pre", "blocks.1.hook_resid_pre", "blocks.0.attn.hook_z"]
    request = {"op": "attribution", "metric": metric, "names": names, **body}
    return server.post("alice", request, {"tokens": tokens, "clean_tokens": tokens.flip(1)})


CASES = [
    Case("forward (logits)", lambda s, k: _forward(s, k)),
    Case("forward, every hook cached", _cache_all),
    Case("forward with interventions", _hooks),
    Case("generate", lambda s, k: _generate(s, k)),
    Case("generate, cache and logits", lambda s, k: _generate(s, k, return_cache=True, output_logits=True)),
    Case("patch: get_act_patch_resid_pre", lambda s, k: _patch(s, k, function="get_act_patch_resid_pre")),
    Case(
        "patch: generic, pattern",
        lambda s, k: _patch(
            s, k, setter="layer_head_pattern_patch_setter", activation="pattern", axes=["layer", "head_index"]
        ),
    ),
    Case("attribution: AtP", lambda s, k: _attribution(s, k)),
    Case("attribution: IG, 8 steps", lambda s, k: _attribution(s, k, method="ig", steps=8, steps_per_forward=4)),
    Case(
        "inspect",
        lambda s, k: s.http.get(
            "/inspect", params={"prompt": "The quick brown fox " * 8 * k}, headers=HEADERS["alice"]
        ),
    ),
    Case("weights: unembed", lambda s, k: s.http.get("/v1/weights/unembed", headers=HEADERS["alice"])),
]


def _job_id(r: httpx.Response) -> str:
    if "x-job-id" in r.headers:
        return r.headers["x-job-id"]
    return json.loads(r.text.splitlines()[0])["job"]


def measure(server: Server, case: Case, scale: int) -> Measured:
    """Send `case` once to warm it up, then again with the peak measured."""
    case.send(server, scale)
    before = server.reset_peak()
    r = case.send(server, scale)
    peak = server.peak()
    assert r.status_code == 200, (case.name, r.status_code, r.text[:300])
    estimate = server.http.get(f"/v1/jobs/{_job_id(r)}", headers=HEADERS["alice"]).json()["estimate"]
    return Measured(
        case.name, r.status_code, estimate["peak_bytes"] / MiB, (peak - before) / MiB, estimate["answer_bytes"] / MiB
    )
