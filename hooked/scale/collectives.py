"""The few `torch.distributed` exchanges the pipeline uses, each with a status so no rank waits forever.

Every tensor sent point-to-point is preceded by an int64 header `[status, ndim, *shape]`;
a rank that failed sends `status=1` and no data, so the stages after it skip their work
instead of waiting. After each pipelined call all ranks exchange their error (or None)
with `all_gather_object`, and every rank raises a `PipelineError`: the rank that failed with
the original traceback, the others with one line pointing at it. The process group's
timeout bounds every call, so even a rank that died is reported, never a hang.

Every pipelined operation (a forward, a cache read, a generate step, a weight view, a
backward) starts with `check_in(what)`: the ranks exchange a short tag naming it and a call
counter, so ranks that called different operations (rank 0 reads the cache while rank 1
runs the next forward) fail at once with both operations named, instead of waiting for
the timeout. Operations nested in a checked-in one (the forward of a generate step) do
not check in again, and point-to-point sends carry no tag.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import logging
import os
import sys
from collections.abc import Iterator
from datetime import timedelta

import torch
import torch.distributed as dist

from hooked.core.errors import HookedError, PipelineError  # noqa: F401  (HookedError: importable from here before)

logger = logging.getLogger(__name__)

_MAX_DIMS = 6
OK, FAILED = 0, 1


DEFAULT_TIMEOUT_S = 300.0
_TAG_CHARS = 160  # a check-in tag: [call counter, length, utf-8 bytes of `what`...]


class _Group:
    """What this process knows of its pipeline's collectives: the timeout and the check-in counter."""

    timeout_s: float | None = None  # None: a process group the caller started (its own timeout)
    default_timeout: bool = False
    calls: int = 0
    depth: int = 0


def timeout_hint() -> str:
    """How long a rank waits for the others, and how to wait less while working interactively."""
    if _Group.timeout_s is None:
        waited = "the process group's timeout"
    else:
        waited = f"timeout_s={_Group.timeout_s:g} s" + (" (the default)" if _Group.default_timeout else "")
    return (
        f"a rank waits {waited} for the others before giving up; for interactive work load with a short one, "
        "e.g. from_pretrained(..., pipeline=True, timeout_s=30)"
    )


def init_group(timeout_s: float | None = None) -> tuple[int, int, torch.device]:
    """`(rank, world_size, device)`, starting the default process group (gloo on CPU, NCCL on GPU) if needed.

    Reads torchrun's environment (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`,
    `MASTER_PORT`); every collective is bounded by `timeout_s` (default 300 s).
    """
    default_timeout, timeout_s = timeout_s is None, DEFAULT_TIMEOUT_S if timeout_s is None else timeout_s
    use_cuda = torch.cuda.is_available()
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
            raise PipelineError(
                "pipeline=True needs a torch.distributed launch: run the script with `torchrun "
                "--nproc-per-node N script.py` (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT are not set)"
            )
        dist.init_process_group("nccl" if use_cuda else "gloo", timeout=timedelta(seconds=timeout_s))
        _Group.timeout_s, _Group.default_timeout = timeout_s, default_timeout
        # a group left to the interpreter's teardown can abort a rank ("terminate called without an active
        # exception") while a peer is still closing its connections: the group we started, we close
        atexit.register(_destroy_group)
    elif not default_timeout and _Group.timeout_s is not None and timeout_s != _Group.timeout_s:
        logger.warning(
            "timeout_s=%g is ignored: this process group was started with timeout_s=%g, which bounds every call",
            timeout_s, _Group.timeout_s,
        )  # fmt: skip
    _install_excepthook()
    return dist.get_rank(), dist.get_world_size(), device


def _destroy_group() -> None:
    """Close the default process group at exit, before the interpreter tears down the backend's threads."""
    if dist.is_initialized():
        dist.destroy_process_group()


def _install_excepthook() -> None:
    """Print an uncaught secondary `PipelineError` as one line: the failing rank shows the traceback."""
    if getattr(sys.excepthook, "_hooked_pipeline", False):
        return
    previous = sys.excepthook

    def hook(kind, value, tb):
        if isinstance(value, PipelineError) and value.secondary:
            logger.error("%s: %s", kind.__name__, value)
            return
        previous(kind, value, tb)

    hook._hooked_pipeline = True
    sys.excepthook = hook


def _transport(fn):
    """Turn the backend's errors (a peer closed its connection, the timeout expired) into `PipelineError`."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except PipelineError:
            raise
        except RuntimeError as e:
            raise PipelineError(f"{fn.__name__}: {stopped_answering(e)}") from e

    return wrapper


def stopped_answering(error: BaseException) -> str:
    return f"a rank stopped answering (it crashed, or is busy elsewhere): {error}. Note: {timeout_hint()}"


def describe(rank: int, error: BaseException) -> str:
    return f"rank {rank} failed: {type(error).__name__}: {error}"


def secondary(message: str, origins: list[int]) -> PipelineError:
    """The error of a rank that only learned of `origins`' failures: one line, pointing at their output."""
    where = " and ".join(f"rank {r}'s" for r in origins)
    logger.debug("%s", message)
    return PipelineError(f"{message} (the traceback is in {where} output)", secondary=True)


def agree(error: BaseException | None, what: str) -> None:
    """Collective: raise a `PipelineError` on every rank if any rank reports an error.

    A rank that failed raises it from its own exception (its traceback shows); the others
    raise a secondary one-line error naming the failed rank(s).
    """
    report = None if error is None else (dist.get_rank(), describe(dist.get_rank(), error))
    reports: list[tuple[int, str] | None] = [None] * dist.get_world_size()
    try:
        dist.all_gather_object(reports, report)
    except RuntimeError as e:  # a peer closed its connection (crashed) or the group's timeout expired
        raise PipelineError(f"{what}: {stopped_answering(e)}") from error or e
    failed = [r for r in reports if r is not None]
    if not failed:
        return
    message = f"{what}: {'; '.join(text for _, text in failed)}"
    if error is None:
        raise secondary(message, [rank for rank, _ in failed]) from None
    raise PipelineError(message) from error


@contextlib.contextmanager
def check_in(what: str, device: torch.device) -> Iterator[None]:
    """Collective: every rank says which pipelined operation it is starting; a mismatch raises at once.

    `what` reads after "rank r is ...", e.g. "in forward()" or "reading cache['blocks.0.hook_resid_pre']".
    One all-gather of a small tensor per operation; operations started inside this one
    (a generate step's forward) do not check in again.
    """
    if _Group.depth:
        yield
        return
    _Group.calls += 1
    _exchange_tags(what, _Group.calls, device)
    _Group.depth += 1
    try:
        yield
    finally:
        _Group.depth -= 1


def _exchange_tags(what: str, call: int, device: torch.device) -> None:
    data = what.encode()[: _TAG_CHARS - 2]
    tag = torch.zeros(_TAG_CHARS, dtype=torch.int64)
    tag[0], tag[1] = call, len(data)
    tag[2 : 2 + len(data)] = torch.tensor(list(data), dtype=torch.int64)
    tags = [torch.empty_like(tag, device=device) for _ in range(dist.get_world_size())]
    try:
        dist.all_gather(tags, tag.to(device))
    except RuntimeError as e:
        raise PipelineError(f"rank {dist.get_rank()} {what} (pipelined call #{call}): {stopped_answering(e)}") from e
    seen = [(int(t[0]), bytes(t[2 : 2 + int(t[1])].tolist()).decode(errors="replace")) for t in tags]
    if len(set(seen)) > 1:
        raise mismatch(seen, dist.get_rank())


def mismatch(seen: list[tuple[int, str]], rank: int) -> PipelineError:
    """The error every rank raises when the ranks started different pipelined operations (`seen[r]`: rank r's
    `(call counter, operation)`); rank 0's is the one whose traceback shows."""
    groups: dict[tuple[int, str], list[int]] = {}
    for r, tag in enumerate(seen):
        groups.setdefault(tag, []).append(r)
    sides = [f"{_ranks(ranks)} {what} (pipelined call #{call})" for (call, what), ranks in groups.items()]
    advice = (
        "every rank must make the same pipelined calls (forward, cache reads, weight views, generate, backward) "
        "in the same order"
    )
    if any("reading cache" in what for _, what in seen):
        advice = "cache reads are collectives: call them on every rank in the same order"
    message = f"{' while '.join(sides)}; {advice}"
    return PipelineError(message, secondary=rank != 0)


def _ranks(ranks: list[int]) -> str:
    if len(ranks) == 1:
        return f"rank {ranks[0]} is"
    return f"ranks {', '.join(map(str, ranks))} are"


@_transport
def send_tensor(tensor: torch.Tensor | None, dst: int, device: torch.device) -> None:
    """Send a header and, unless `tensor` is None (this rank failed), the tensor."""
    header = torch.zeros(2 + _MAX_DIMS, dtype=torch.int64, device=device)
    if tensor is None:
        header[0] = FAILED
        dist.send(header, dst)
        return
    header[1] = tensor.ndim
    header[2 : 2 + tensor.ndim] = torch.tensor(tensor.shape)
    dist.send(header, dst)
    dist.send(tensor.contiguous(), dst)


@_transport
def recv_tensor(src: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor | None:
    """The tensor `send_tensor` sent from `src`, or None if that rank reported a failure."""
    header = torch.empty(2 + _MAX_DIMS, dtype=torch.int64, device=device)
    dist.recv(header, src)
    if int(header[0]) == FAILED:
        return None
    shape = header[2 : 2 + int(header[1])].tolist()
    tensor = torch.empty(shape, dtype=dtype, device=device)
    dist.recv(tensor, src)
    return tensor


@_transport
def broadcast_object(obj, src: int):
    """Collective: `obj` of rank `src` on every rank (pickled; for small things only)."""
    box = [obj]
    dist.broadcast_object_list(box, src)
    return box[0]


@_transport
def broadcast_tensor(tensor: torch.Tensor | None, src: int, device: torch.device) -> torch.Tensor:
    """Collective: rank `src`'s tensor on every rank (shape and dtype first, then the data)."""
    meta = broadcast_object(None if tensor is None else (tuple(tensor.shape), tensor.dtype), src)
    if meta is None:
        raise PipelineError(f"rank {src} has no tensor to broadcast")
    if dist.get_rank() == src:
        assert tensor is not None  # `meta` above came from this rank's tensor
        out = tensor.to(device)
        dist.broadcast(out.detach().contiguous(), src)  # only read here: autograd keeps `out`'s own graph
        return out
    out = torch.empty(meta[0], dtype=meta[1], device=device)
    dist.broadcast(out, src)
    return out
