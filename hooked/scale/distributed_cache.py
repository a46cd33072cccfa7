"""Cached activations of a pipelined model: each stays on the rank that computed it until read.

`run_with_cache` on a `PipelineTransformer` returns an `ActivationCache` over a
`DistributedCacheDict`: reading `cache[name]` is a broadcast from the rank that owns the
hook point, so every rank must read the same names in the same order (SPMD).
"""

from __future__ import annotations

from typing import Iterator, Mapping

import torch
import torch.distributed as dist

from hooked.scale.collectives import broadcast_tensor


class DistributedCacheDict(Mapping):
    """Cached activations spread over ranks; reading one is a broadcast from the rank that owns it.

    Building it is a collective (all ranks exchange the names they hold). Fetched copies
    are kept, so each activation crosses the network at most once.
    """

    def __init__(self, local: dict[str, torch.Tensor], model):
        self.local, self.device, self.rank = local, model.device, model.rank
        names = [None] * model.stage.world_size
        dist.all_gather_object(names, list(local))
        self.owner: dict[str, int] = {}
        for rank, held in enumerate(names):
            for name in held:
                self.owner.setdefault(name, rank)
        self.fetched: dict[str, torch.Tensor] = {}

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self.owner:
            raise KeyError(name)
        owner = self.owner[name]
        if name not in self.fetched:  # the same on every rank: the first read of a name is the collective
            local = self.local[name] if self.rank == owner else None
            shared = broadcast_tensor(local, owner, self.device)
            self.fetched[name] = local if self.rank == owner else shared
        return self.fetched[name]

    def __contains__(self, name) -> bool:
        return name in self.owner

    def __iter__(self) -> Iterator[str]:
        return iter(self.owner)

    def __len__(self) -> int:
        return len(self.owner)


class SliceParts(dict):
    """A cache that keeps every value a hook stores under a name (one per micro-batch slice)."""

    def __init__(self):
        super().__init__()
        self.parts: dict[str, list[torch.Tensor]] = {}

    def __setitem__(self, name: str, value: torch.Tensor) -> None:
        self.parts.setdefault(name, []).append(value)

    def assemble(self) -> dict[str, torch.Tensor]:
        return {k: v[0] if len(v) == 1 else torch.cat(v, dim=0) for k, v in self.parts.items()}
