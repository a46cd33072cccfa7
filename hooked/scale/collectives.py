"""The few `torch.distributed` exchanges the pipeline uses, each with a status so no rank waits forever.

Every tensor sent point-to-point is preceded by an int64 header `[status, ndim, *shape]`;
a rank that failed sends `status=1` and no data, so the stages after it skip their work
instead of waiting. After each pipelined call all ranks exchange their error (or None)
with `all_gather_object`, and every rank raises the same `PipelineError`. The process
group's timeout bounds every call, so even a rank that died is reported, never a hang.
"""

from __future__ import annotations

import functools
import logging
import os
from datetime import timedelta

import torch
import torch.distributed as dist

from hooked.errors import HookedError

logger = logging.getLogger(__name__)

_MAX_DIMS = 6
OK, FAILED = 0, 1


class PipelineError(HookedError, RuntimeError):
    """A rank of the pipeline failed; raised on every rank, naming the rank and its exception."""


def init_group(timeout_s: float = 300.0) -> tuple[int, int, torch.device]:
    """`(rank, world_size, device)`, starting the default process group (gloo on CPU, NCCL on GPU) if needed.

    Reads torchrun's environment (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`,
    `MASTER_PORT`); every collective is bounded by `timeout_s`.
    """
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
    return dist.get_rank(), dist.get_world_size(), device


def _transport(fn):
    """Turn the backend's errors (a peer closed its connection, the timeout expired) into `PipelineError`."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except PipelineError:
            raise
        except RuntimeError as e:
            raise PipelineError(f"{fn.__name__}: a rank stopped answering (it crashed or timed out): {e}") from e

    return wrapper


def describe(rank: int, error: BaseException) -> str:
    return f"rank {rank} failed: {type(error).__name__}: {error}"


def agree(error: BaseException | None, what: str) -> None:
    """Collective: raise the same `PipelineError` on every rank if any rank reports an error."""
    report = None if error is None else describe(dist.get_rank(), error)
    reports = [None] * dist.get_world_size()
    try:
        dist.all_gather_object(reports, report)
    except RuntimeError as e:  # a peer closed its connection (crashed) or the group's timeout expired
        raise PipelineError(f"{what}: a rank stopped answering (it crashed or timed out): {e}") from error or e
    failed = [r for r in reports if r is not None]
    if failed:
        raise PipelineError(f"{what}: {'; '.join(failed)}") from error


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
        out = tensor.to(device)
        dist.broadcast(out.detach().contiguous(), src)  # only read here: autograd keeps `out`'s own graph
        return out
    out = torch.empty(meta[0], dtype=meta[1], device=device)
    dist.broadcast(out, src)
    return out
