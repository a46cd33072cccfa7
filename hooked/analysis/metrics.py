"""Declared metrics: scalar functions of logits that are also data.

`hooked.analysis.patching` and `hooked.circuits.attribution_patch` take a metric, a function of the
logits `[batch, pos, d_vocab]` returning a scalar. A server cannot run a function a client
wrote, so these three common metrics are objects: called locally they compute the value;
sent to `hooked serve` they travel as a small JSON spec (`to_spec` / `from_spec`).

    logit_diff(correct, incorrect, pos=-1)   mean over rows of logit(correct) - logit(incorrect)
    log_prob(token, pos=-1)                  mean log-probability of `token`
    projection(direction, pos=-1)            mean of logits[:, pos] . direction
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from jaxtyping import Float

from hooked.core.errors import InputError

Logits = Float[torch.Tensor, "batch pos d_vocab"]


def _token_list(value, what: str) -> list[int]:
    items = [value] if isinstance(value, int) and not isinstance(value, bool) else value
    if not isinstance(items, (list, tuple)) or not items or len(items) > 4096:
        raise InputError(f"{what} must be a token id or a non-empty list of token ids, got {value!r:.60}")
    if not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in items):
        raise InputError(f"{what} must hold non-negative int token ids, got {value!r:.60}")
    return list(items)


def _pos(value) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InputError(f"pos must be an int position (negative counts from the end), got {value!r:.40}")
    return value


class Metric:
    """A scalar of the logits; `op` names it in specs."""

    op = ""

    def __call__(self, logits: Logits) -> Float[torch.Tensor, ""]:
        raise NotImplementedError

    def to_spec(self) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
        raise NotImplementedError

    def _check_vocab(self, logits: Logits, tokens: Sequence[int]) -> None:
        if max(tokens) >= logits.shape[-1]:
            raise InputError(f"{self.op}: token id {max(tokens)} is outside the vocabulary of {logits.shape[-1]}")


class LogitDiff(Metric):
    """Mean over rows of (mean logit of `correct`) - (mean logit of `incorrect`) at `pos`."""

    op = "logit_diff"

    def __init__(self, correct, incorrect, pos: int = -1):
        self.correct, self.incorrect = _token_list(correct, "correct"), _token_list(incorrect, "incorrect")
        self.pos = _pos(pos)

    def __call__(self, logits):
        self._check_vocab(logits, self.correct + self.incorrect)
        last = logits[:, self.pos].float()  # [batch, d_vocab]
        return (last[:, self.correct].mean(-1) - last[:, self.incorrect].mean(-1)).mean()

    def to_spec(self):
        return {"op": self.op, "correct": self.correct, "incorrect": self.incorrect, "pos": self.pos}, {}


class LogProb(Metric):
    """Mean over rows of log p(`token`) at `pos`."""

    op = "log_prob"

    def __init__(self, token: int, pos: int = -1):
        self.token = _token_list(token, "token")[0]
        self.pos = _pos(pos)

    def __call__(self, logits):
        self._check_vocab(logits, [self.token])
        return logits[:, self.pos].float().log_softmax(-1)[:, self.token].mean()

    def to_spec(self):
        return {"op": self.op, "token": self.token, "pos": self.pos}, {}


class Projection(Metric):
    """Mean over rows of `logits[:, pos] . direction` (a direction in vocabulary space)."""

    op = "projection"

    def __init__(self, direction: torch.Tensor, pos: int = -1):
        if not isinstance(direction, torch.Tensor) or direction.ndim != 1 or not direction.is_floating_point():
            raise InputError("direction must be a float vector [d_vocab]")
        self.direction, self.pos = direction.detach(), _pos(pos)

    def __call__(self, logits):
        if self.direction.shape[0] != logits.shape[-1]:
            raise InputError(f"direction has {self.direction.shape[0]} entries; the logits have {logits.shape[-1]}")
        return (logits[:, self.pos].float() @ self.direction.to(logits.device, torch.float32)).mean()

    def to_spec(self):
        return {"op": self.op, "direction": "metric.direction", "pos": self.pos}, {
            "metric.direction": self.direction.cpu()
        }


def logit_diff(correct, incorrect, pos: int = -1) -> LogitDiff:
    return LogitDiff(correct, incorrect, pos)


def log_prob(token: int, pos: int = -1) -> LogProb:
    return LogProb(token, pos)


def projection(direction: torch.Tensor, pos: int = -1) -> Projection:
    return Projection(direction, pos)


def from_spec(spec: object, tensors: dict[str, torch.Tensor]) -> Metric:
    """Rebuild a metric from `to_spec`'s output; anything else raises `InputError`."""
    if not isinstance(spec, dict):
        raise InputError(f"a metric spec must be an object, got {spec!r:.60}")
    op, fields = spec.get("op"), {k: v for k, v in spec.items() if k != "op"}
    try:
        if op == "logit_diff" and set(fields) <= {"correct", "incorrect", "pos"}:
            return LogitDiff(**fields)
        if op == "log_prob" and set(fields) <= {"token", "pos"}:
            return LogProb(**fields)
        if op == "projection" and set(fields) <= {"direction", "pos"} and fields.get("direction") in tensors:
            return Projection(tensors[fields["direction"]], fields.get("pos", -1))
    except TypeError as e:
        raise InputError(f"metric {op!r}: {e}") from None
    raise InputError(
        f"unknown metric spec {spec!r:.80}: use hooked.analysis.metrics.logit_diff, log_prob or projection "
        "(a server never runs a metric function you wrote)"
    )


__all__ = ["LogProb", "LogitDiff", "Metric", "Projection", "from_spec", "log_prob", "logit_diff", "projection"]
