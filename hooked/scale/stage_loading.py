"""Loading one pipeline stage: each rank reads from the checkpoint only the tensors its blocks need.

The converters (`loading/`) are written for a whole state dict. Instead of changing them,
a rank runs its family's converter twice over lazy views of the checkpoint:

1. a *tracing* pass where every tensor is a shape-only `meta` tensor that remembers which
   checkpoint keys it was computed from, to learn which checkpoint keys feed the
   TransformerLens tensors this stage owns;
2. a *reading* pass where only those keys are read from disk (`StageStateView`); every
   other key is an empty `meta` tensor of the right shape and dtype.

What the stage does not own stays on `meta` (no memory) in the model, which is otherwise
the ordinary `HookedTransformer` module tree, so hook names are the single-process names.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_map

from hooked.core.errors import InputError
from hooked.loading.checkpoint import NamesFiles, ReadsMeta

logger = logging.getLogger(__name__)

_LAYER_KEY = re.compile(r"(?:^|\.)(\d+)(?:\.|$)")
_FIRST_MODULES = ("embed", "pos_embed", "hook_embed", "hook_pos_embed", "hook_tokens")
_LAST_MODULES = ("ln_final", "unembed")


# -- the split -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Stage:
    """The contiguous blocks `layers` of pipeline stage `rank` out of `world_size`."""

    rank: int
    world_size: int
    layers: range
    n_layers: int

    @property
    def is_first(self) -> bool:
        return self.rank == 0

    @property
    def is_last(self) -> bool:
        return self.rank == self.world_size - 1

    def owns_name(self, name: str) -> bool:
        """Whether a parameter or hook name (`blocks.3.attn.W_Q`, `hook_embed`, `unembed.W_U`) lives here."""
        return owner_of(name, self.world_size, self.n_layers) == self.rank


def split_layers(n_layers: int, world_size: int) -> list[range]:
    """Contiguous, balanced stages: the first `n_layers % world_size` stages get one block more."""
    if world_size > n_layers:
        raise InputError(
            f"pipeline over {world_size} ranks but the model has only {n_layers} blocks: every stage needs at "
            f"least one block; launch at most {n_layers} processes (torchrun --nproc-per-node)"
        )
    base, extra = divmod(n_layers, world_size)
    bounds, start = [], 0
    for rank in range(world_size):
        stop = start + base + (rank < extra)
        bounds.append(range(start, stop))
        start = stop
    return bounds


def make_stage(n_layers: int, world_size: int, rank: int) -> Stage:
    return Stage(rank, world_size, split_layers(n_layers, world_size)[rank], n_layers)


def owner_of(name: str, world_size: int, n_layers: int) -> int:
    """The rank that owns a TransformerLens parameter or hook name."""
    if name.startswith("blocks."):
        layer = int(name.split(".")[1])
        for rank, layers in enumerate(split_layers(n_layers, world_size)):
            if layer in layers:
                return rank
        raise KeyError(f"{name}: layer {layer} is beyond the model's {n_layers} blocks")
    head = name.split(".")[0]
    if head in _FIRST_MODULES:
        return 0
    if head in _LAST_MODULES:
        return world_size - 1
    raise KeyError(f"{name}: no pipeline stage owns this name")


# -- tracing which checkpoint keys feed which converted tensors ----------------------------


class _Traced(torch.Tensor):
    """A meta tensor carrying `sources`: the checkpoint keys it was computed from."""

    sources: frozenset = frozenset()

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.data_ptr:  # meta tensors all report 0; converters compare pointers to detect ties
            return 1 + (hash(args[0].sources) & 0xFFFFFFFF)
        flat, _ = tree_flatten((args, kwargs))
        sources = frozenset().union(*(getattr(a, "sources", frozenset()) for a in flat if isinstance(a, torch.Tensor)))
        out = super().__torch_function__(func, types, args, kwargs)

        def tag(x):
            if isinstance(x, _Traced):
                x.sources = sources
            return x

        return tree_map(tag, out)


def _meta_of(state: Mapping[str, torch.Tensor], key: str) -> torch.Tensor:
    """An empty meta tensor with the shape and dtype of `state[key]`, without reading it."""
    if isinstance(state, ReadsMeta):  # SafetensorsStateDict: from the header, nothing read
        return state.meta(key)
    return state[key].to("meta")


class _TracingView(Mapping):
    def __init__(self, state: Mapping[str, torch.Tensor]):
        self._state = state

    def __getitem__(self, key: str) -> torch.Tensor:
        t = _meta_of(self._state, key).as_subclass(_Traced)
        t.sources = frozenset([key])
        return t

    def __contains__(self, key) -> bool:
        return key in self._state

    def __iter__(self) -> Iterator[str]:
        return iter(self._state)

    def __len__(self) -> int:
        return len(self._state)


def trace_sources(convert, state: Mapping[str, torch.Tensor], cfg) -> dict[str, frozenset]:
    """`{converted key: checkpoint keys it is computed from}`, by running `convert` on meta tensors."""
    with torch.no_grad():
        out = convert(_TracingView(state), cfg)
    return {k: getattr(v, "sources", frozenset()) for k, v in out.items()}


def _layer_of_checkpoint_key(key: str) -> int | None:
    match = _LAYER_KEY.search(key)
    return None if match is None else int(match.group(1))


def keys_by_name(state: Mapping[str, torch.Tensor], stage: Stage) -> set[str]:
    """Fallback when tracing fails: keys of this stage's layers, plus non-layer keys on the end stages."""
    needed = set()
    for key in state:
        layer = _layer_of_checkpoint_key(key)
        if layer is None:
            if stage.is_first or stage.is_last:
                needed.add(key)
        elif layer in stage.layers:
            needed.add(key)
    return needed


def needed_keys(convert, state: Mapping[str, torch.Tensor], cfg, stage: Stage) -> set[str]:
    """The checkpoint keys the converted tensors owned by `stage` are computed from."""
    try:
        sources = trace_sources(convert, state, cfg)
    except Exception as e:  # a converter that looks at values: fall back to key names
        logger.info("tracing the converter on meta tensors failed (%s); selecting keys by layer number", e)
        return keys_by_name(state, stage)
    needed = set()
    for name, keys in sources.items():
        if stage.owns_name(name):
            needed |= keys
    return needed


# -- the reading view --------------------------------------------------------------------------


class StageStateView(Mapping):
    """The checkpoint as the converter sees it on one rank: `needed` keys are read, others are meta.

    `requested` records, in order, every key actually read from the checkpoint (tests assert on it).
    """

    def __init__(self, state: Mapping[str, torch.Tensor], needed: set[str]):
        self._state = state
        self.needed = needed
        self.requested: list[str] = []

    def __getitem__(self, key: str) -> torch.Tensor:
        if key not in self.needed:
            return _meta_of(self._state, key)
        self.requested.append(key)
        return self._state[key]

    def __contains__(self, key) -> bool:
        return key in self._state

    def __iter__(self) -> Iterator[str]:
        return iter(self._state)

    def __len__(self) -> int:
        return len(self._state)

    def file_of(self, key: str):
        return self._state.file_of(key) if isinstance(self._state, NamesFiles) else "hf_model's state dict"


def meta_except_owned(state: dict[str, torch.Tensor], stage: Stage) -> dict[str, torch.Tensor]:
    """Converted tensors: owned ones must be real; every other one becomes meta (frees any real data)."""
    out = {}
    for name, tensor in state.items():
        if stage.owns_name(name):
            if tensor.is_meta:
                raise RuntimeError(f"{name} belongs to stage {stage.rank} but was not read from the checkpoint")
            out[name] = tensor
        else:
            out[name] = tensor if tensor.is_meta else torch.empty_like(tensor, device="meta")
    return out


# -- fingerprints -------------------------------------------------------------------------------


def checkpoint_fingerprint(state: Mapping[str, torch.Tensor], hf_config: Any) -> str:
    """A digest of the config, every tensor's name/shape/dtype, and the first and last bytes of each file.

    Cheap (no tensor is read), and different for a different checkpoint or revision.
    """
    h = hashlib.sha256()
    to_dict = getattr(hf_config, "to_dict", None)
    h.update(json.dumps(to_dict() if to_dict else str(hf_config), sort_keys=True, default=str).encode())
    for key in sorted(state):
        meta = _meta_of(state, key)
        h.update(f"{key}:{tuple(meta.shape)}:{meta.dtype};".encode())
    files = sorted({str(state.file_of(k)) for k in state}) if isinstance(state, NamesFiles) else []
    for path in files:
        with open(path, "rb") as f:
            h.update(f.read(1 << 16))
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - (1 << 16)))
            h.update(f.read())
            h.update(str(size).encode())
    return h.hexdigest()
