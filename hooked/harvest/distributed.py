"""Data parallelism under torchrun: rank r harvests shards k with k % WORLD_SIZE == r into its own files.

Each rank writes `manifest-rank{r}.json`; after a barrier rank 0 merges them into `manifest.json`,
which then describes the whole dataset (the union equals a single-process harvest). The output
directory must be shared by every rank (one machine, or a shared filesystem across machines).
"""

from __future__ import annotations

import datetime
import os
from pathlib import Path

import torch.distributed as dist

from hooked.harvest import writer

TIMEOUT = datetime.timedelta(minutes=30)


def rank_and_world() -> tuple[int, int]:
    """(RANK, WORLD_SIZE) from torchrun's environment, or from an initialized process group; (0, 1) otherwise."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def setup(timeout: datetime.timedelta = TIMEOUT) -> tuple[int, int]:
    """Join the gloo process group when launched with WORLD_SIZE > 1 (unless one exists); return (rank, world)."""
    rank, world = rank_and_world()
    if world > 1 and not dist.is_initialized():
        seconds = float(os.environ.get("HOOKED_HARVEST_TIMEOUT_S", timeout.total_seconds()))
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=seconds))
    return rank_and_world()


def barrier() -> None:
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def merge_manifests(out: Path, rank: int, world: int) -> dict:
    """After every rank finished, rank 0 writes `manifest.json` listing every rank's shards; all return it."""
    barrier()
    if rank == 0:
        per_rank = [writer.read_json(writer.manifest_path(out, r, world)) for r in range(world)]
        previous = out / writer.MANIFEST  # a merged manifest from an earlier run (maybe another world size)
        earlier = [writer.read_json(previous)] if previous.exists() else []
        shards = {s["index"]: s for m in earlier + per_rank for s in m["shards"]}
        merged = dict(per_rank[0], rank=None, world_size=world, shards=[shards[k] for k in sorted(shards)])
        merged["complete"] = all(m["complete"] for m in per_rank)
        writer.write_json_atomic(out / writer.MANIFEST, merged)
    barrier()
    return writer.read_json(out / writer.MANIFEST)
