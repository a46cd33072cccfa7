"""Reading a local HuggingFace checkpoint directory without instantiating the model."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Iterator, Mapping

import torch

logger = logging.getLogger(__name__)


class SafetensorsStateDict(Mapping):
    """A lazy state dict over one or more `.safetensors` files: a tensor is read when indexed."""

    def __init__(self, files: list[Path]):
        from safetensors import safe_open

        self._handles = [safe_open(str(f), framework="pt") for f in files]
        self._where = {key: h for h in self._handles for key in h.keys()}

    def __getitem__(self, key: str) -> torch.Tensor:
        return self._where[key].get_tensor(key)

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
