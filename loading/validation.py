"""Checks every checkpoint passes through on its way into a model, whatever its family.

- `from_pretrained` arguments (checked once, by `LoadOptions`): unknown names raise
  `TypeError` with close matches; the HuggingFace loading arguments `hooked` understands
  are honoured (`torch_dtype`) or refused (`trust_remote_code=True`: no code from a
  checkpoint is ever run).
- `dtype` strings are checked against the floating dtypes a model can run in.
- Conversion runs through `convert_checked`, which records which HF tensor (and file)
  each converted tensor came from; a converter that fails on a tensor of the wrong
  shape (a fused `c_attn`, `qkv_proj`, `gate_up_proj` ...) becomes a `WeightShapeError`
  naming that tensor, its shape and its file.
- `check_converted_shapes` compares every converted tensor with the shape the model built
  from the config expects, before any processing, so a checkpoint that disagrees with
  its config never loads (a `[1]` norm weight would otherwise broadcast).
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable, Iterator, Mapping

import torch

from hooked.core.errors import CheckpointError, HookedError, InputError, UnsafeCheckpointError, WeightShapeError
from hooked.core.validation import to_dtype  # noqa: F401  (re-exported)

#: HuggingFace `from_pretrained` keyword arguments that `hooked.from_pretrained` accepts.
HF_LOADING_ARGS = ("revision", "token", "cache_dir", "local_files_only", "trust_remote_code", "torch_dtype")


# -- arguments -------------------------------------------------------------------------------
def check_loading_kwarg_names(names, accepted) -> None:
    """Refuse a keyword name that is not `accepted`, suggesting the accepted names closest to it."""
    unknown = [k for k in names if k not in accepted]
    if unknown:
        close = difflib.get_close_matches(unknown[0], list(accepted), n=3, cutoff=0.6)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise TypeError(
            f"from_pretrained() got an unexpected keyword argument {unknown[0]!r}.{hint} "
            f"Accepted HuggingFace loading arguments: {', '.join(HF_LOADING_ARGS)}."
        )


def refuse_remote_code(trust_remote_code) -> None:
    """`trust_remote_code=True` is refused: no code shipped with a checkpoint is ever run."""
    if trust_remote_code:
        raise UnsafeCheckpointError(
            "trust_remote_code=True is refused: hooked converts weights with its own code and never runs Python "
            "code shipped with a checkpoint. Load a supported architecture (loading.supported_architectures())."
        )


def merge_torch_dtype(dtype, torch_dtype) -> torch.dtype:
    """HF's `torch_dtype=` as `dtype`; refused when `dtype` was also set to something else."""
    torch_dtype = to_dtype(torch_dtype, "torch_dtype")
    if dtype not in ("float32", torch.float32) and to_dtype(dtype) != torch_dtype:
        raise InputError(f"dtype={dtype!r} and torch_dtype={torch_dtype} disagree: pass only dtype=")
    return torch_dtype


def check_from_pretrained_kwargs(from_pretrained, kw: dict) -> dict:
    """The three checks above applied to `kw["from_pretrained_kwargs"]` (its signature before `LoadOptions`).

    Returns the HF loading arguments to pass on; `kw["dtype"]` takes `torch_dtype`.
    """
    extra = dict(kw.get("from_pretrained_kwargs") or {})
    known = [p for p in inspect.signature(from_pretrained).parameters if p not in ("cls", "from_pretrained_kwargs")]
    check_loading_kwarg_names(extra, list(HF_LOADING_ARGS) + known)
    refuse_remote_code(extra.pop("trust_remote_code", False))
    if "torch_dtype" in extra:
        kw["dtype"] = merge_torch_dtype(kw.get("dtype", "float32"), extra.pop("torch_dtype"))
    return extra


# -- conversion --------------------------------------------------------------------------------
class TrackedState(Mapping):
    """A read-through view of an HF state dict that remembers which key each tensor came from."""

    def __init__(self, state: Mapping[str, torch.Tensor], where: Callable[[str], str]):
        self.state, self.where = state, where
        self.origin: dict[int, str] = {}  # storage pointer -> HF key
        self.recent: list[str] = []  # the last few keys read, oldest first

    def __getitem__(self, key: str) -> torch.Tensor:
        tensor = self.state[key]
        self.recent = [k for k in self.recent if k != key][-2:] + [key]
        if isinstance(tensor, torch.Tensor) and tensor.device.type != "meta":
            self.origin.setdefault(tensor.untyped_storage().data_ptr(), key)
        return tensor

    def __contains__(self, key) -> bool:
        return key in self.state

    def __iter__(self) -> Iterator[str]:
        return iter(self.state)

    def __len__(self) -> int:
        return len(self.state)

    def describe_recent(self) -> str:
        """The tensors read last (the converter failed on one of them)."""
        return ", ".join(self.describe(k) for k in reversed(self.recent)) or "the checkpoint"

    def describe(self, key: str | None) -> str:
        if key is None:
            return "the checkpoint"
        shape = list(self.state[key].shape) if key in self.state else "?"
        return f"{key!r} (shape {shape}) in {self.where(key)}"

    def source_of(self, tensor: torch.Tensor) -> str:
        if tensor.device.type == "meta":
            return "the checkpoint"
        key = self.origin.get(tensor.untyped_storage().data_ptr())
        return "the checkpoint (a derived tensor)" if key is None else self.describe(key)


def convert_checked(convert, state: Mapping[str, torch.Tensor], cfg, where: Callable[[str], str]):
    """`convert(state, cfg)`, with failures on malformed tensors reported as checkpoint errors.

    Returns `(converted_state, tracked)`; `tracked.source_of(t)` names a tensor's origin.
    """
    tracked = TrackedState(state, where)
    try:
        return convert(tracked, cfg), tracked
    except (HookedError, NotImplementedError):  # deliberate refusals pass through unchanged
        raise
    except KeyError as e:
        raise CheckpointError(
            f"the checkpoint has no tensor {e.args[0]!r}, which {cfg.original_architecture} needs "
            f"(last tensors read: {tracked.describe_recent()}); the file may be incomplete"
        ) from e
    except (RuntimeError, ValueError, IndexError) as e:
        raise WeightShapeError(
            f"converting the tensors last read, {tracked.describe_recent()}, failed: {e}. One of them does not fit "
            f"the config ({_dims(cfg)})"
        ) from e


def check_converted_shapes(expected: Mapping[str, tuple[int, ...]], state: Mapping[str, torch.Tensor], tracked) -> None:
    """Every converted tensor must have the shape the model built from the config has for it."""
    for name, tensor in state.items():
        want = expected.get(name)
        if want is not None and tuple(tensor.shape) != tuple(want):
            raise WeightShapeError(
                f"{name} has shape {list(tensor.shape)}, but the config implies {list(want)}; it comes from "
                f"{tracked.source_of(tensor)}. The checkpoint's tensors disagree with its config.json."
            )


def _dims(cfg) -> str:
    fields = ("d_model", "n_heads", "d_head", "n_key_value_heads", "d_mlp", "d_vocab", "n_layers")
    return ", ".join(f"{f}={getattr(cfg, f)}" for f in fields if getattr(cfg, f, None) is not None)


def where_in(state: Mapping[str, torch.Tensor]) -> Callable[[str], str]:
    """A function naming the file a key is stored in (or the in-memory source)."""
    file_of = getattr(state, "file_of", None)
    return (lambda key: str(file_of(key))) if file_of is not None else (lambda key: "hf_model's state dict")
