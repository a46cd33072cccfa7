"""Reading a local HuggingFace checkpoint directory without instantiating the model."""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch

from hooked.core.errors import CheckpointError, UnsafeCheckpointError

logger = logging.getLogger(__name__)


_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}


#: Largest safetensors JSON header accepted (the safetensors library's own limit).
MAX_HEADER_BYTES = 100_000_000
#: Extensions of pickle-based weight files, which hooked never opens.
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")


@runtime_checkable
class ReadsMeta(Protocol):
    """A state dict that gives a tensor's shape and dtype from its header, without reading the data."""

    def meta(self, key: str) -> torch.Tensor: ...


@runtime_checkable
class NamesFiles(Protocol):
    """A state dict that knows the checkpoint file each tensor is stored in (for error messages)."""

    def file_of(self, key: str) -> Any: ...


class SafetensorsStateDict(Mapping):
    """A lazy state dict over `.safetensors` files: a tensor is read from disk when indexed.

    Each tensor is read straight into its own buffer with `readinto`, not through a
    memory map, so the only memory a read costs is the tensor itself. Headers are
    validated when the files are opened (see `read_safetensors_header`), so a corrupt or
    truncated file fails before any tensor is read.
    """

    def __init__(self, files: list[Path]):
        self._where: dict[str, tuple[Path, dict, int]] = {}
        for path in files:
            header, data_start = read_safetensors_header(path)
            for key, info in header.items():
                self._where[key] = (path, info, data_start)

    def __getitem__(self, key: str) -> torch.Tensor:
        path, info, data_start = self._where[key]
        begin, end = info["data_offsets"]
        if info["dtype"] not in _DTYPES:
            raise NotImplementedError(f"{key}: safetensors dtype {info['dtype']} is not supported")
        tensor = torch.empty(info["shape"], dtype=_DTYPES[info["dtype"]])
        buffer = tensor.view(-1).view(torch.uint8).numpy() if tensor.numel() else None
        with open(path, "rb") as f:
            f.seek(data_start + begin)
            # numpy's stubs declare the buffer protocol (__buffer__) only for Python >= 3.12
            if buffer is not None and f.readinto(buffer) != end - begin:  # pyright: ignore[reportArgumentType]
                raise CheckpointError(f"{path}: truncated data for tensor {key}; the file is incomplete")
        return tensor

    def file_of(self, key: str) -> Path:
        return self._where[key][0]

    def shape_of(self, key: str) -> tuple[int, ...]:
        return tuple(self._where[key][1]["shape"])

    def meta(self, key: str) -> torch.Tensor:
        """The tensor's shape and dtype on the `meta` device, read from the header alone (no data)."""
        info = self._where[key][1]
        return torch.empty(info["shape"], dtype=_DTYPES.get(info["dtype"], torch.uint8), device="meta")

    def __contains__(self, key) -> bool:  # Mapping's default would read the tensor to answer
        return key in self._where

    def __iter__(self) -> Iterator[str]:
        return iter(self._where)

    def __len__(self) -> int:
        return len(self._where)


def read_safetensors_header(path: Path) -> tuple[dict, int]:
    """`(header without __metadata__, byte offset of the data)`, after checking the file's structure.

    Raises `CheckpointError` naming the file for: fewer than 8 bytes, a header length
    beyond the file or above `MAX_HEADER_BYTES`, a header that is not a JSON object, and
    entries whose shape, dtype or data offsets are malformed or point past the file.
    """
    size = path.stat().st_size
    if size < 8:
        raise CheckpointError(f"{path}: not a safetensors file ({size} bytes; the 8-byte header length is missing)")
    with open(path, "rb") as f:
        header_len = int.from_bytes(f.read(8), "little")
        if header_len > MAX_HEADER_BYTES:
            raise CheckpointError(f"{path}: header length {header_len} exceeds the {MAX_HEADER_BYTES}-byte limit")
        if header_len > size - 8:
            raise CheckpointError(f"{path}: header length {header_len} is beyond the file size {size}; truncated?")
        try:
            header = json.loads(f.read(header_len))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise CheckpointError(f"{path}: the safetensors header is not valid JSON ({e})") from e
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: the safetensors header is not a JSON object")
    header.pop("__metadata__", None)
    data_size = size - 8 - header_len
    for key, info in header.items():
        _check_entry(path, key, info, data_size)
    return header, 8 + header_len


def _check_entry(path: Path, key: str, info: Any, data_size: int) -> None:
    ok = isinstance(info, dict) and isinstance(info.get("shape"), list) and isinstance(info.get("data_offsets"), list)
    ok = ok and all(isinstance(n, int) and n >= 0 for n in info["shape"]) and len(info["data_offsets"]) == 2
    ok = ok and all(isinstance(n, int) for n in info["data_offsets"]) and isinstance(info.get("dtype"), str)
    if not ok:
        raise CheckpointError(f"{path}: malformed header entry for tensor {key!r}: {str(info)[:200]}")
    begin, end = info["data_offsets"]
    if not 0 <= begin <= end <= data_size:
        raise CheckpointError(
            f"{path}: tensor {key!r} has data offsets [{begin}, {end}] outside the {data_size} data bytes; truncated?"
        )
    if info["dtype"] in _DTYPES:
        n_bytes = math.prod(info["shape"]) * torch.empty(0, dtype=_DTYPES[info["dtype"]]).element_size()
        if n_bytes != end - begin:
            raise CheckpointError(
                f"{path}: tensor {key!r} of shape {info['shape']} ({info['dtype']}) needs {n_bytes} bytes, "
                f"but its data offsets span {end - begin}"
            )


def safetensors_files(directory: Path) -> list[Path]:
    """The checkpoint's `.safetensors` files; shard names must stay inside `directory`."""
    index = directory / "model.safetensors.index.json"
    if index.exists():
        return [_shard_path(directory, s, index) for s in sorted(set(_weight_map(index).values()))]
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        pickles = sorted(p.name for p in directory.iterdir() if p.suffix in PICKLE_SUFFIXES)
        if pickles:
            raise UnsafeCheckpointError(
                f"{directory} holds only pickle weights ({', '.join(pickles)}), which hooked never opens: "
                "unpickling can run arbitrary code. Convert them once, in a trusted environment, with "
                "save_pretrained(..., safe_serialization=True), or pass hf_model= with the model already loaded."
            )
        raise FileNotFoundError(
            f"No .safetensors weights in {directory}. Save the model with save_pretrained(..., "
            "safe_serialization=True), or pass hf_model= with the model already loaded."
        )
    return files


def _weight_map(index: Path) -> dict:
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
    except (ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"{index}: not a valid safetensors index (needs a 'weight_map' object): {e}") from e
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise CheckpointError(f"{index}: 'weight_map' must map tensor names to shard file names")
    return weight_map


def _shard_path(directory: Path, name: str, index: Path) -> Path:
    """`directory / name`, refusing absolute names and any that resolve outside `directory`."""
    path = directory / name
    root = directory.resolve()
    if Path(name).is_absolute() or ".." in Path(name).parts or root not in (path.resolve(), *path.resolve().parents):
        raise UnsafeCheckpointError(
            f"{index}: shard file name {name!r} points outside the checkpoint directory {directory}"
        )
    if not path.name.endswith(".safetensors"):
        raise UnsafeCheckpointError(f"{index}: shard {name!r} is not a .safetensors file; hooked never opens others")
    return path


def load_hf_config(directory: Path):
    """The HF config of a local checkpoint; never runs code shipped with it (`trust_remote_code=False`)."""
    from transformers import AutoConfig

    return refuse_remote_code(directory, lambda: AutoConfig.from_pretrained(str(directory), trust_remote_code=False))


def load_tokenizer(name_or_path: str | Path):
    """A HuggingFace tokenizer from a local directory (or the hub, when online); never runs checkpoint code."""
    from transformers import AutoTokenizer

    return refuse_remote_code(
        name_or_path, lambda: AutoTokenizer.from_pretrained(str(name_or_path), trust_remote_code=False)
    )


def refuse_remote_code(where, load):
    """`load()`, turning transformers' "needs trust_remote_code" error into a clear refusal."""
    try:
        return load()
    except ValueError as e:
        if "trust_remote_code" not in str(e):
            raise
        raise UnsafeCheckpointError(
            f"{where} needs custom Python code shipped with the checkpoint (auto_map), and hooked never runs "
            "checkpoint code. Use a checkpoint of a supported architecture (loading.supported_architectures())."
        ) from e


def has_tokenizer(directory: Path) -> bool:
    return any((directory / f).exists() for f in ("tokenizer.json", "tokenizer_config.json", "vocab.json"))


#: files an HF processor (image processor and tokenizer together) is saved as
PROCESSOR_FILES = ("processor_config.json", "preprocessor_config.json")


def load_processor(directory: Path):
    """The checkpoint's HF processor (image-text models: the image processor and tokenizer), None without one.

    Loaded offline from the directory; image processors need Pillow (`pip install pillow`).
    """
    if not any((directory / f).exists() for f in PROCESSOR_FILES):
        return None
    from transformers import AutoProcessor

    return refuse_remote_code(directory, lambda: AutoProcessor.from_pretrained(str(directory), trust_remote_code=False))
