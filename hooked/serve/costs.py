"""Admission by cost: what a request will take in memory and forwards, known before it runs.

Every hook point's activation has a shape that is a fixed function of the batch size and the
number of positions (`[batch, pos, d_model]`, `[batch, head, pos, pos]`, ...). `ActivationSizes`
measures those functions once, at start, from four tiny forwards of the served model, so the
estimates hold for any architecture without a table of hook names. From them each operation's
`Cost` follows (`forward_cost`, `generate_cost`, ...): the memory it needs while it runs (its
answer included), the answer it leaves until it is delivered, and its number of forwards. The
server refuses a request whose cost exceeds its budgets with a 413 naming the limit and the
estimate (`admit`), before anything is allocated.

The working-set factors (`FORWARD_LAYERS`, `GRAD_ACTIVATIONS`, ...) were measured on GPT-2 and
LLaMA-style models: the peak resident memory of each operation, over the estimate, stays below 1
(docs/serving.md, "What a request costs", has the table and `benchmarks/serve_costs.py` remakes it).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from hooked.core.errors import WireError

#: Memory of one request besides its tensors: the decoded body's objects, HTTP buffers, Python frames.
BASE_BYTES = 32 * 2**20
#: An inference forward keeps about one block's activations alive (x2 for what no hook point names:
#: the inputs of a softmax, a mask, a matmul's output before its reshape) and its logits (x1.5: a
#: metric's or a sampler's float copy of some of them).
FORWARD_LAYERS, FORWARD_LOGITS = 2.0, 1.5
#: A forward with gradients keeps every activation for the backward pass (x1.5, as above), and its
#: logits four times over (the logits, their gradient, a softmax and its gradient).
GRAD_ACTIVATIONS, GRAD_LOGITS = 1.5, 4.0
#: `generate(return_cache=True)` records each step's activations, then stitches them into one copy.
GENERATION_CACHE = 2.5
#: (batch, pos) of the probe forwards: three to fit each axis, the fourth to check the fit.
PROBES = ((1, 3), (2, 3), (1, 5), (2, 7))
LAYER = re.compile(r"blocks\.(\d+)\.")


@dataclass(frozen=True)
class HookShape:
    """One hook point's activation: each axis `const + per_batch * batch + per_pos * pos`.

    `axes` is None for an activation whose shape depends on the data (a mixture-of-experts
    expert's tokens): its size is then bounded by `per_token` bytes per (batch, pos) element.
    """

    axes: tuple[tuple[int, int, int], ...] | None
    itemsize: int
    per_token: float = 0.0

    def shape(self, batch: int, pos: int) -> tuple[int, ...] | None:
        if self.axes is None:
            return None
        return tuple(c + kb * batch + kp * pos for c, kb, kp in self.axes)

    def nbytes(self, batch: int, pos: int) -> int:
        shape = self.shape(batch, pos)
        if shape is None:
            return math.ceil(self.per_token * batch * pos)
        return math.prod(shape) * self.itemsize


def _fit(shapes: list[tuple[int, ...]]) -> tuple[tuple[int, int, int], ...] | None:
    """Axes affine in batch and pos from the first three probes, checked on the fourth (None if not)."""
    (b0, p0), (b1, _), (_, p2), (b3, p3) = PROBES
    if len({len(s) for s in shapes}) != 1:
        return None
    axes = []
    for a, b, c, d in zip(*shapes, strict=True):
        kb, kp = (b - a) // (b1 - b0), (c - a) // (p2 - p0)
        const = a - kb * b0 - kp * p0
        if const + kb * b3 + kp * p3 != d or (b - a) % (b1 - b0) or (c - a) % (p2 - p0):
            return None
        axes.append((const, kb, kp))
    return tuple(axes)


class ActivationSizes:
    """The shape of every hook point's activation as a function of (batch, pos), and the logits'.

    Built by `probe` from four tiny forwards that cache every active hook point.
    """

    def __init__(self, hooks: dict[str, HookShape], d_vocab_out: int, logits_itemsize: int, n_layers: int):
        self.hooks, self.d_vocab_out, self.logits_itemsize, self.n_layers = (
            hooks,
            d_vocab_out,
            logits_itemsize,
            n_layers,
        )

    @classmethod
    def probe(cls, model, run_with_cache: Callable | None = None) -> ActivationSizes:
        """Measure `model` (`run_with_cache(tokens) -> (logits, {name: tensor})`: how a pipeline runs it)."""
        run = run_with_cache or (lambda t: model.run_with_cache(t, return_cache_object=False))
        seen: dict[str, list[torch.Tensor]] = {}
        logits = None
        with torch.inference_mode():
            for batch, pos in PROBES:
                logits, cache = run(torch.zeros(batch, pos, dtype=torch.long))
                for name, t in cache.items():
                    seen.setdefault(name, []).append(t)
        assert logits is not None  # PROBES is not empty
        hooks = {name: _hook_shape(ts) for name, ts in seen.items() if len(ts) == len(PROBES)}
        return cls(hooks, model.cfg.d_vocab_out, logits.element_size(), model.cfg.n_layers)

    def nbytes(self, names: Iterable[str], batch: int, pos: int) -> int:
        """Bytes of the activations of `names` (hook points the probe never saw count 0: they do not run)."""
        return sum(self.hooks[n].nbytes(batch, pos) for n in names if n in self.hooks)

    def shape(self, name: str, batch: int, pos: int) -> tuple[int, ...] | None:
        hook = self.hooks.get(name)
        return None if hook is None else hook.shape(batch, pos)

    def all_bytes(self, batch: int, pos: int) -> int:
        return self.nbytes(self.hooks, batch, pos)

    def layer_bytes(self, batch: int, pos: int) -> int:
        """The most bytes of activations any one block (or the parts outside the blocks) holds."""
        per_layer: dict[str, int] = {}
        for name, hook in self.hooks.items():
            match = LAYER.match(name)
            key = match.group(1) if match else "outside"
            per_layer[key] = per_layer.get(key, 0) + hook.nbytes(batch, pos)
        return max(per_layer.values(), default=0)

    def logits_bytes(self, batch: int, pos: int) -> int:
        return batch * pos * self.d_vocab_out * self.logits_itemsize

    def forward_bytes(self, batch: int, pos: int) -> int:
        """Working memory of one inference forward (`FORWARD_LAYERS`, `FORWARD_LOGITS`)."""
        return int(FORWARD_LAYERS * self.layer_bytes(batch, pos) + FORWARD_LOGITS * self.logits_bytes(batch, pos))

    def grad_forward_bytes(self, batch: int, pos: int) -> int:
        """Working memory of one forward and its backward (`GRAD_ACTIVATIONS`, `GRAD_LOGITS`)."""
        return int(GRAD_ACTIVATIONS * self.all_bytes(batch, pos) + GRAD_LOGITS * self.logits_bytes(batch, pos))


def _hook_shape(tensors: list[torch.Tensor]) -> HookShape:
    itemsize = tensors[0].element_size()
    axes = _fit([tuple(t.shape) for t in tensors])
    per_token = max(t.numel() * t.element_size() / (b * p) for t, (b, p) in zip(tensors, PROBES, strict=True))
    return HookShape(axes, itemsize, per_token)


@dataclass(frozen=True)
class Cost:
    """What one request takes, estimated before it runs.

    Attributes:
        peak_bytes: memory while it runs, beyond the loaded model (its answer included).
        answer_bytes: the answer, held until the client has read it.
        forwards: forward passes (the deadline is checked in each).
    """

    peak_bytes: int
    answer_bytes: int
    forwards: int

    def describe(self) -> str:
        return (
            f"about {_size(self.peak_bytes)} of memory, a {_size(self.answer_bytes)} answer, {self.forwards} forwards"
        )


@dataclass(frozen=True)
class Budget:
    """The per-request budgets a `Cost` is checked against (`hooked serve --max-request-memory`, ...)."""

    max_request_memory: int
    max_answer_bytes: int


def admit(cost: Cost, budget: Budget, hint: str = "") -> None:
    """Refuse (413) a request over a budget, naming the limit, the estimate and `hint` (what to change)."""
    if cost.peak_bytes > budget.max_request_memory:
        raise WireError(
            f"this request needs {_size(cost.peak_bytes)} of memory by the server's estimate; the limit is "
            f"{_size(budget.max_request_memory)} per request (--max-request-memory){hint}",
            413,
        )
    if cost.answer_bytes > budget.max_answer_bytes:
        raise WireError(
            f"this request's answer would be {_size(cost.answer_bytes)}; the limit is "
            f"{_size(budget.max_answer_bytes)} per answer (--max-answer-bytes){hint}",
            413,
        )


def _size(n: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # (unreachable: GiB is the last unit)


# -- the operations -----------------------------------------------------------------------------
def forward_cost(
    sizes: ActivationSizes, batch: int, pos: int, cache: list[str], hooked: list[str], logits: bool
) -> Cost:
    """A forward (`run_with_cache` when `cache` names hook points) with interventions on `hooked`."""
    cached = sizes.nbytes(cache, batch, pos)
    # an intervention computes a replacement and a selection the size of its activation
    edits = 2 * max((sizes.nbytes([n], batch, pos) for n in hooked), default=0)
    answer = cached + (sizes.logits_bytes(batch, pos) if logits else 0)
    return Cost(BASE_BYTES + sizes.forward_bytes(batch, pos) + cached + edits, answer, 1)


def generate_cost(
    sizes: ActivationSizes,
    batch: int,
    pos: int,
    new: int,
    kv_names: list[str],
    cache: list[str],
    logits: bool,
    kv: bool,
) -> Cost:
    """`generate` of `new` tokens: the KV cache (`kv_names`: every layer's keys and values, grown by
    concatenation, so twice), the prefill, each step's logits and the recorded `cache`."""
    total = pos + new
    work = sizes.forward_bytes(batch, pos) if kv else sizes.forward_bytes(batch, total)
    kv_bytes = 2 * sizes.nbytes(kv_names, batch, total) if kv else 0
    step_logits = batch * new * sizes.d_vocab_out * 4 if logits else 0  # float32, one [batch, d_vocab] per step
    recorded = sizes.nbytes(cache, batch, total)
    answer = batch * total * 8 * 2 + step_logits + recorded  # sequences and mask (int64), logits, cache
    peak = BASE_BYTES + work + kv_bytes + 2 * step_logits + int(GENERATION_CACHE * recorded) + answer
    return Cost(peak, answer, new + 1)


def patch_cost(
    sizes: ActivationSizes,
    batches: tuple[int, int],
    pos: int,
    cached: list[str],
    patched: list[str],
    patches: int,
    per_forward: int,
) -> Cost:
    """A patching sweep: the clean cache of `cached`, the corrupted residual stream before each block,
    and forwards of `per_forward` patched copies of the batch (a copy of the patched activation each).

    `batches` is (corrupted batch, clean batch)."""
    batch, clean_batch = batches
    rows = batch * per_forward
    clean = sizes.nbytes(cached, clean_batch, pos)
    prefix = sizes.n_layers * sizes.nbytes(["blocks.0.hook_resid_pre"], batch, pos)
    edit = 2 * max((sizes.nbytes([n], rows, pos) for n in patched), default=0)
    answer = 8 * patches
    peak = BASE_BYTES + clean + prefix + sizes.forward_bytes(rows, pos) + edit + answer
    return Cost(peak, answer, math.ceil(patches / per_forward) + 2)


def attribution_cost(
    sizes: ActivationSizes,
    batch: int,
    pos: int,
    names: list[str],
    method: str,
    steps: int,
    per_forward: int,
    drops: int,
) -> Cost:
    """Attribution patching: the clean cache of `names`, then AtP's forward and backward (`drops` times
    with GradDrop) or, per name, integrated gradients over `steps` points, `per_forward` at a time."""
    cached = sizes.nbytes(names, batch, pos)
    if method == "ig":
        per_name = max(
            (
                sizes.grad_forward_bytes(batch * per_forward, pos) + (per_forward + 3) * sizes.nbytes([n], batch, pos)
                for n in names
            ),
            default=0,
        )
        work, forwards = per_name, 1 + len(names) * (1 + math.ceil(steps / per_forward))
    else:
        work, forwards = sizes.grad_forward_bytes(batch, pos) + 2 * cached, 1 + drops
    answer = cached
    return Cost(BASE_BYTES + 2 * cached + work + answer, answer, forwards)


def inspect_cost(sizes: ActivationSizes, pos: int, heads: int, window: int) -> Cost:
    """`hooked inspect --html`'s views: a forward caching everything, the views computed from it (twice
    that), and a page of about 64 bytes per number shown (attention over at most `window` positions)."""
    shown = min(pos, window)
    page = 2**20 + 64 * (heads * shown * shown + sizes.n_layers * pos)
    peak = BASE_BYTES + 2 * sizes.all_bytes(1, pos) + 2 * sizes.logits_bytes(1, pos) + page
    return Cost(peak, page, 1)


def weights_cost(nbytes: int) -> Cost:
    """The parameters of one part: sent from the model's own memory."""
    return Cost(BASE_BYTES + nbytes, nbytes, 0)


__all__ = [
    "ActivationSizes",
    "Budget",
    "Cost",
    "HookShape",
    "admit",
    "attribution_cost",
    "forward_cost",
    "generate_cost",
    "inspect_cost",
    "patch_cost",
    "weights_cost",
]
