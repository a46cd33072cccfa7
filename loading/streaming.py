"""Converting and processing a checkpoint one part at a time (the embeddings and heads, then each block).

The converters and processing steps are written for a whole state dict. Run on a view of
the checkpoint whose tensors outside one part are `meta` (shape and dtype only, no data),
they produce that part's real tensors and cost nothing for the rest. So a model can be
placed on several devices or offloaded to disk while only one block's weights are ever in
memory: no step of conversion or processing mixes tensors of two blocks (folding a norm
reads the block's own norm; the final norm folds into the unembedding, both in part None).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Iterator, Mapping

import torch

from hooked.loading.checkpoint import NamesFiles, ReadsMeta
from hooked.loading.validation import convert_checked

#: a block's index: the number after a block list's name (`layers`, `h`, `blocks`, `block`, `layer`), so that
#: other numbered lists (Gemma 3n's `altup_projections.0`, HuBERT's `conv_layers.0`) belong to no block
_LAYER_INDEX = re.compile(r"(?:^|\.)(?:layers|h|blocks|block|layer)\.(\d+)\.")

#: A part: a block index, or None for everything outside the blocks (embeddings, final norm, unembedding).
Part = int | None


def source_part(key: str) -> Part:
    """The block an HF checkpoint key belongs to: the first index of a block list (`model.layers.3.mlp...` -> 3)."""
    match = _LAYER_INDEX.search(key)
    return int(match.group(1)) if match else None


def converted_part(key: str) -> Part:
    """The block a hooked state-dict key belongs to (`blocks.3.attn.W_Q` -> 3), None outside the blocks."""
    return int(key.split(".", 2)[1]) if key.startswith("blocks.") else None


class PartView(Mapping):
    """The checkpoint with real tensors for one part and `meta` tensors for all others.

    `reads` records the keys whose data was read, so tests can check that a part reads only its own tensors.
    """

    def __init__(self, state: Mapping[str, torch.Tensor], part: Part, reads: list[str] | None = None):
        self.state, self.part, self.reads = state, part, reads

    def __getitem__(self, key: str) -> torch.Tensor:
        if source_part(key) != self.part:
            return _meta(self.state, key)
        tensor = self.state[key]
        if self.reads is not None:
            self.reads.append(key)
        return tensor

    def __contains__(self, key) -> bool:
        return key in self.state

    def __iter__(self) -> Iterator[str]:
        return iter(self.state)

    def __len__(self) -> int:
        return len(self.state)

    def file_of(self, key: str):
        if not isinstance(self.state, NamesFiles):  # used by error messages when the state is a checkpoint
            raise AttributeError(f"{type(self.state).__name__} does not record the file of each tensor")
        return self.state.file_of(key)


def _meta(state: Mapping[str, torch.Tensor], key: str) -> torch.Tensor:
    if isinstance(state, ReadsMeta):
        return state.meta(key)
    if key not in state:
        raise KeyError(key)
    return state[key].to("meta")  # an in-memory state dict (hf_model=): no data is copied


def processing_steps(cfg, flags: Mapping[str, bool]) -> list[str]:
    """The processing steps that will run (skips are logged once, here)."""
    from hooked.processing.steps import check_refactorable, resolve_steps

    steps = resolve_steps(cfg, dict(flags))
    if "refactor_factored_attn_matrices" in steps:
        check_refactorable(cfg)
    return steps


def iter_processed_parts(
    convert: Callable,
    state: Mapping[str, torch.Tensor],
    cfg,
    steps: list[str],
    where: Callable[[str], str],
    reads: list[str] | None = None,
) -> Iterator[tuple[Part, dict[str, torch.Tensor]]]:
    """`(part, {hooked key: tensor})` for part None, then blocks 0 ... n-1, each converted and processed alone.

    `cfg` is the config before processing (it is copied, never changed); tensors are float32
    where processing ran, as in `load_and_process_state_dict`, and cast by the caller.
    """
    for part in [None, *range(cfg.n_layers)]:
        work = copy.deepcopy(cfg)
        converted, _ = convert_checked(convert, PartView(state, part, reads), work, where)
        # tensors a converter makes from nothing (zero biases) must not mix devices with meta ones
        sd = {k: v if converted_part(k) == part else v.to("meta") for k, v in converted.items()}
        yield part, _process(sd, work, steps, part)


def _process(sd: dict[str, torch.Tensor], cfg, steps: list[str], part: Part) -> dict[str, torch.Tensor]:
    from hooked.processing.steps import run_steps

    cfg.dtype = torch.float32  # processing stores float32; the placement casts once (as process_state_dict)
    sd = run_steps(sd, cfg, steps)
    out = {k: v for k, v in sd.items() if converted_part(k) == part}
    meta = [k for k, v in out.items() if v.device.type == "meta"]
    if meta:
        raise RuntimeError(f"streamed conversion left {meta[:3]} without data: this converter mixes blocks")
    return out
