"""`ActivationReader`: stream harvested rows (one token's activation each) shard by shard, optionally shuffled.

Only one shard (plus, when shuffling, a bounded buffer of rows) is in memory at a time, so a
dataset far larger than RAM can feed an SAE or probe training loop:

    reader = ActivationReader("acts/")
    for batch in reader.batches(4096, shuffle=True, seed=0):
        x = batch["blocks.6.hook_resid_post"]   # [4096, d_model]

`reader.stream(hook, batch_size)` is the same as an endless iterator of one hook's `[batch, d_model]` tensors:
the `data_provider` SAELens's `SAETrainer` takes (docs/harvest-to-sae.md).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterator
from pathlib import Path

import torch

from hooked.core.errors import InputError
from hooked.harvest import writer

logger = logging.getLogger(__name__)
META = ("tokens", "doc_index", "pos_index", "context_index")


class ActivationReader:
    """Rows of a harvest directory: per hook `[rows, *row_shape]`, plus token ids and document/position indices.

    Reads one shard at a time (plus a bounded shuffle buffer), never the whole harvest.

    Args:
        out_dir: the `--out` directory of `hooked harvest` (or `harvest(..., out=)`).
    """

    def __init__(self, out_dir: str | Path):
        self.out = Path(out_dir)
        path = self.out / writer.MANIFEST
        if not path.exists():
            raise InputError(f"{str(path)!r} does not exist: point ActivationReader at a `hooked harvest` --out dir.")
        self.manifest = writer.read_json(path)
        if not self.manifest.get("complete"):
            logger.warning(
                "%s is an unfinished harvest: reading its %d complete shards.", self.out, len(self.manifest["shards"])
            )
        self.hooks = list(self.manifest["hooks"])
        self.shards = self.manifest["shards"]

    def __len__(self) -> int:
        return sum(s["rows"] for s in self.shards)

    def __repr__(self) -> str:
        ident = self.manifest["identity"]
        hooks = ", ".join(f"{h} {list(self.row_shape(h))}" for h in self.hooks)
        state = "complete" if self.manifest.get("complete") else "unfinished"
        return (
            f"ActivationReader({str(self.out)!r}: {len(self)} rows in {len(self.shards)} shards ({state}), "
            f"{ident['dtype']}, hooks {hooks}; model {self.manifest['model']['name']}, context_length "
            f"{ident['context_length']}, positions {ident['positions']!r}, {ident['tokenization']} tokenization)"
        )

    @property
    def dtype(self) -> torch.dtype:
        """The stored activations' dtype."""
        return getattr(torch, self.manifest["identity"]["dtype"])

    def row_shape(self, hook: str) -> tuple[int, ...]:
        return tuple(self.manifest["hooks"][hook]["row_shape"])

    def read_shard(self, i: int, keys: list[str] | None = None) -> dict[str, torch.Tensor]:
        """Shard i's rows, flattened to `[rows, ...]`, for `keys` (default: every hook and META)."""
        from safetensors import safe_open

        keys = self._keys(keys)
        out = {}
        with safe_open(str(self.out / self.shards[i]["file"]), framework="pt") as f:
            for key in keys:
                t = f.get_tensor(key)
                if self.manifest["layout"] == "contexts":
                    if key == "context_index":  # [contexts] -> one per row
                        t = t.repeat_interleave(f.get_slice("tokens").get_shape()[1])
                    else:
                        t = t.flatten(0, 1)  # [contexts, pos, ...] -> [rows, ...]
                out[key] = t
        return out

    def batches(
        self,
        batch_size: int = 4096,
        keys: list[str] | None = None,
        shuffle: bool = False,
        seed: int = 0,
        buffer_rows: int = 1 << 18,
        drop_last: bool = False,
    ) -> Iterator[dict[str, torch.Tensor]]:
        """Yield dicts of `[batch_size, ...]` tensors. With `shuffle`, shards come in a seeded random order and rows
        are mixed in a buffer of about `buffer_rows` rows: the same seed gives the same batches."""
        if batch_size < 1:
            raise InputError(f"batch_size={batch_size} must be positive.")
        keys = self._keys(keys)
        gen = torch.Generator().manual_seed(seed)
        order = torch.randperm(len(self.shards), generator=gen).tolist() if shuffle else range(len(self.shards))
        buffer: dict[str, torch.Tensor] | None = None
        for i in order:
            shard = self.read_shard(i, keys)
            buffer = shard if buffer is None else {k: torch.cat([buffer[k], shard[k]]) for k in keys}
            n = len(buffer[keys[0]])
            if shuffle and n < buffer_rows:
                continue
            if shuffle:  # mix, then emit half and keep the other half to mix with the next shards
                buffer = _permute(buffer, gen)
                emit = (n // 2) // batch_size * batch_size
            else:
                emit = n // batch_size * batch_size
            yield from _split(buffer, 0, emit, batch_size)
            buffer = {k: v[emit:] for k, v in buffer.items()}
        if buffer is not None and len(buffer[keys[0]]):
            if shuffle:
                buffer = _permute(buffer, gen)
            n = len(buffer[keys[0]])
            yield from _split(buffer, 0, n // batch_size * batch_size if drop_last else n, batch_size)

    def stream(
        self,
        hook: str,
        batch_size: int = 4096,
        shuffle: bool = True,
        seed: int = 0,
        dtype: torch.dtype | None = torch.float32,
        **batch_kwargs,
    ) -> Iterator[torch.Tensor]:
        """Endless `[batch_size, *row_shape]` batches of one hook, epoch after epoch (epoch e shuffled with seed + e):
        the `data_provider` SAELens's `SAETrainer` takes. Every batch is full; `dtype` converts (None: as stored)."""
        if hook not in self.hooks:
            raise InputError(f"Unknown hook {hook!r}: this harvest holds {self.hooks}.")
        if len(self) < batch_size:
            raise InputError(
                f"batch_size={batch_size} is more than the harvest's {len(self)} rows; pass a smaller one."
            )
        for epoch in itertools.count():
            for batch in self.batches(batch_size, [hook], shuffle, seed + epoch, drop_last=True, **batch_kwargs):
                yield batch[hook] if dtype is None else batch[hook].to(dtype)

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        return self.batches()

    def read_all(self, key: str) -> torch.Tensor:
        """Every row of one hook (or META key) in order, in memory: for small datasets and tests."""
        return torch.cat([self.read_shard(i, [key])[key] for i in range(len(self.shards))])

    def read_all_rows(self) -> dict[str, torch.Tensor]:
        """Token ids and document/position indices of every row, in order (small; no activations)."""
        return {k: self.read_all(k) for k in META}

    def _keys(self, keys: list[str] | None) -> list[str]:
        keys = list(self.hooks) + list(META) if keys is None else list(keys)
        unknown = [k for k in keys if k not in self.hooks and k not in META]
        if unknown:
            raise InputError(f"Unknown keys {unknown}: this harvest holds hooks {self.hooks} and {list(META)}.")
        return keys


def _permute(buffer: dict[str, torch.Tensor], gen: torch.Generator) -> dict[str, torch.Tensor]:
    perm = torch.randperm(len(next(iter(buffer.values()))), generator=gen)
    return {k: v[perm] for k, v in buffer.items()}


def _split(buffer: dict[str, torch.Tensor], start: int, stop: int, size: int) -> Iterator[dict[str, torch.Tensor]]:
    for a in range(start, stop, size):
        yield {k: v[a : min(a + size, stop)] for k, v in buffer.items()}
