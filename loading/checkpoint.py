"""Reading a local HuggingFace checkpoint directory without instantiating the model."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Iterator, Mapping

import torch

logger = logging.getLogger(__name__)


_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool,
}


class SafetensorsStateDict(Mapping):
    """A lazy state dict over `.safetensors` files: a tensor is read from disk when indexed.

    Each tensor is read straight into its own buffer with `readinto`, not through a
    memory map, so the only memory a read costs is the tensor itself.
    """

    def __init__(self, files: list[Path]):
        self._where: dict[str, tuple[Path, dict, int]] = {}
        for path in files:
            with open(path, "rb") as f:
                header_len = int.from_bytes(f.read(8), "little")
                header = json.loads(f.read(header_len))
            header.pop("__metadata__", None)
            for key, info in header.items():
                self._where[key] = (path, info, 8 + header_len)

    def __getitem__(self, key: str) -> torch.Tensor:
        path, info, data_start = self._where[key]
        begin, end = info["data_offsets"]
        if info["dtype"] not in _DTYPES:
            raise NotImplementedError(f"{key}: safetensors dtype {info['dtype']} is not supported")
        tensor = torch.empty(info["shape"], dtype=_DTYPES[info["dtype"]])
        buffer = tensor.view(-1).view(torch.uint8).numpy() if tensor.numel() else None
        with open(path, "rb") as f:
            f.seek(data_start + begin)
            if buffer is not None and f.readinto(buffer) != end - begin:
                raise OSError(f"{path}: truncated data for tensor {key}")
        return tensor

    def __contains__(self, key) -> bool:  # Mapping's default would read the tensor to answer
        return key in self._where

    def __iter__(self) -> Iterator[str]:
        return iter(self._where)

    def __len__(self) -> int:
        return len(self._where)


def safetensors_files(directory: Path) -> list[Path]:
    index = directory / "model.safetensors.index.json"
    if index.exists():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [directory / s for s in shards]
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(
            f"No .safetensors weights in {directory}. Save the model with save_pretrained(..., "
            "safe_serialization=True), or pass hf_model= with the model already loaded."
        )
    return files


def load_hf_config(directory: Path):
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(str(directory))


def load_tokenizer(name_or_path: str | Path):
    """A HuggingFace tokenizer from a local directory (or the hub, when online)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(name_or_path))


def has_tokenizer(directory: Path) -> bool:
    return any((directory / f).exists() for f in ("tokenizer.json", "tokenizer_config.json", "vocab.json"))
