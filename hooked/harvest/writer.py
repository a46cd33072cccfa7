"""Sharded safetensors output with an atomically rewritten JSON manifest, written on a background thread.

Each shard is serialized to bytes, written to `<name>.tmp` and renamed into place (`os.replace`), and
only then listed in the manifest (itself rewritten through a temp file). A job killed at any moment
therefore leaves only complete shards in the manifest; a rerun skips them and overwrites the rest.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import queue
import threading
import time
from pathlib import Path
from typing import Any

import torch

from hooked.core.errors import (  # noqa: F401  (HookedError, InputError: importable from here before)
    HarvestMismatchError,
    HarvestWriteError,
    HookedError,
    InputError,
)

SHARD_NAME = "shard-{rank:03d}-{index:06d}.safetensors"
MANIFEST = "manifest.json"
FORMAT = "hooked-activations/1"
logger = logging.getLogger(__name__)


def manifest_path(out: Path, rank: int, world: int) -> Path:
    """`manifest.json` for a single process; `manifest-rank{r}.json` per rank under torchrun (merged later)."""
    return out / (MANIFEST if world == 1 else f"manifest-rank{rank:03d}.json")


def write_json_atomic(path: Path, obj: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as fh:
        json.dump(obj, fh, indent=1)
    os.replace(tmp, path)


def read_json(path: Path) -> dict:
    with open(path) as fh:
        return json.load(fh)


def read_manifests(out: Path) -> list[dict]:
    """Every manifest in `out` (merged and per-rank)."""
    found = []
    for path in sorted(out.glob("manifest*.json")):
        manifest = read_json(path)
        if manifest.get("format") != FORMAT:
            raise HarvestMismatchError(f"{path} is not a hooked activation manifest ({FORMAT}); use another --out.")
        found.append(manifest)
    return found


def check_same_identity(out: Path, manifests: list[dict], identity: dict) -> None:
    """Raise if an existing harvest in `out` was made with other arguments (a mixed dataset otherwise)."""
    for manifest in manifests:
        old = manifest["identity"]
        if old != identity:
            keys = sorted(k for k in set(old) | set(identity) if old.get(k) != identity.get(k))
            diffs = "; ".join(f"{k}: existing {old.get(k)!r}, now {identity.get(k)!r}" for k in keys)
            raise HarvestMismatchError(
                f"{out} already holds a harvest made with other arguments ({diffs}). Rerun with the same "
                f"arguments to resume it, or pass a new output directory."
            )


def completed_shards(manifests: list[dict]) -> dict[int, dict]:
    """Shard index -> shard record, over every manifest, for shards whose file is still present."""
    return {s["index"]: s for m in manifests for s in m["shards"]}


def check_writable(out: Path) -> None:
    """Create `out` and write a probe file, turning OSError into a clear HarvestWriteError."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / f".probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise HarvestWriteError(
            e.errno, f"Cannot write harvest output to {str(out)!r}: {e.strerror or e}. Pass a writable --out."
        ) from e


def write_bytes(path: Path, data: bytes) -> None:
    with open(path, "wb") as fh:
        fh.write(data)


class HarvestInterrupted(KeyboardInterrupt):
    """Ctrl-C during a harvest; the message says how many shards were kept and how to resume."""


class ShardWriter:
    """Writes shards in submission order on one background thread (at most `depth` shards pending)."""

    def __init__(self, out: Path, manifest: dict, rank: int, world: int, depth: int = 2):
        self.out, self.manifest, self.rank = out, manifest, rank
        self.path = manifest_path(out, rank, world)
        self.error: BaseException | None = None
        self.queue: queue.Queue = queue.Queue(maxsize=depth)
        self.thread = threading.Thread(target=self._run, name="hooked-harvest-writer", daemon=True)
        self.thread.start()

    def submit(self, index: int, tensors: dict[str, torch.Tensor], record: dict[str, Any]) -> None:
        """Queue shard `index` (CPU tensors); blocks while `depth` shards wait. Raises a writer error."""
        self._raise()
        self.queue.put((index, tensors, record))
        self._raise()

    def close(self, **final: Any) -> dict:
        """Wait for pending shards, write the final manifest (with `final` fields) and return it."""
        self.queue.put(None)
        self.thread.join()
        self._raise()
        self.manifest.update(final)
        self._save_manifest()
        return self.manifest

    def abort(self, timeout: float = 120.0) -> list[dict]:
        """Stop after the shards already queued are written (waiting at most `timeout` s); the shards kept."""
        deadline = time.monotonic() + timeout
        try:
            self.queue.put(None, timeout=timeout)
        except queue.Full:
            logger.warning("harvest: the shard writer did not drain in %.0f s; unwritten shards are dropped", timeout)
        self.thread.join(max(0.0, deadline - time.monotonic()))
        return list(self.manifest["shards"])

    def _raise(self) -> None:
        if self.error is not None:
            raise self.error

    def _run(self) -> None:
        while (item := self.queue.get()) is not None:
            if self.error is None:
                try:
                    self._write(*item)
                except BaseException as e:  # reported to the harvesting thread
                    self.error = e

    def _write(self, index: int, tensors: dict[str, torch.Tensor], record: dict[str, Any]) -> None:
        from safetensors.torch import save

        name = SHARD_NAME.format(rank=self.rank, index=index)
        path = self.out / name
        tmp = path.with_name(name + ".tmp")
        try:
            write_bytes(tmp, save({k: v.contiguous() for k, v in tensors.items()}, metadata={"index": str(index)}))
            os.replace(tmp, path)
            self.manifest["shards"].append(dict(record, file=name, index=index, rank=self.rank))
            self.manifest["shards"].sort(key=lambda s: s["index"])
            self._save_manifest()
        except OSError as e:
            tmp.unlink(missing_ok=True)
            full = " (the disk is full)" if e.errno == errno.ENOSPC else ""
            raise HarvestWriteError(
                e.errno,
                f"Could not write {str(path)!r}{full}: {e.strerror or e}. The {len(self.manifest['shards'])} "
                f"shards listed in {self.path.name} are complete and valid; free space or fix the directory and "
                f"rerun the same command to resume.",
            ) from e

    def _save_manifest(self) -> None:
        write_json_atomic(self.path, self.manifest)
