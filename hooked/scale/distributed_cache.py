"""Cached activations of a pipelined model: each stays on the rank that computed it until read.

`run_with_cache` on a `PipelineTransformer` returns an `ActivationCache` over a
`DistributedCacheDict`: reading `cache[name]` is a broadcast from the rank that owns the
hook point, so every rank must read the same names in the same order (SPMD).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import torch
import torch.distributed as dist

from hooked.scale.collectives import broadcast_tensor, check_in


class DistributedCacheDict(Mapping):
    """Cached activations spread over ranks; reading one is a broadcast from the rank that owns it.

    Building it is a collective (all ranks exchange the names they hold). Fetched copies
    are kept, so each activation crosses the network at most once.
    """

    def __init__(self, local: dict[str, torch.Tensor], model):
        self.local, self.device, self.rank = local, model.device, model.rank
        names = [None] * model.stage.world_size
        with check_in("collecting the names of cached activations", model.device):
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
            with check_in(f"reading cache[{name!r}]", self.device):
                shared = broadcast_tensor(local, owner, self.device)
            self.fetched[name] = self.local[name] if self.rank == owner else shared
        return self.fetched[name]

    def __setitem__(self, name: str, value: torch.Tensor) -> None:
        """A value every rank computed alike (SPMD; e.g. `compute_head_results`): kept here, read without
        a collective."""
        self.fetched[name] = value
        self.owner.setdefault(name, self.rank)

    def __contains__(self, name) -> bool:
        return name in self.owner

    def __iter__(self) -> Iterator[str]:
        return iter(self.owner)

    def __len__(self) -> int:
        return len(self.owner)


class SliceParts(dict):
    """A cache that keeps every value a hook stores under a name (one per micro-batch slice), in slice order.

    Forward values arrive in slice order. Gradients arrive in autograd's order, so each is
    placed by the forward call it belongs to (`HookPoint.grad_forward_call`).
    """

    def __init__(self, hook_dict: dict | None = None):
        super().__init__()
        self.parts: dict[str, list[tuple[int, torch.Tensor]]] = {}
        self.hook_dict = hook_dict or {}

    def __setitem__(self, name: str, value: torch.Tensor) -> None:
        values = self.parts.setdefault(name, [])
        point = self.hook_dict.get(name.removesuffix("_grad")) if name.endswith("_grad") else None
        order = point.grad_forward_call if point is not None else len(values)
        values.append((order, value))

    def assemble(self) -> dict[str, torch.Tensor]:
        out = {}
        for name, values in self.parts.items():
            ordered = [v for _, v in sorted(values, key=lambda item: item[0])]
            out[name] = ordered[0] if len(ordered) == 1 else torch.cat(ordered, dim=0)  # [batch, ...]
        return out
