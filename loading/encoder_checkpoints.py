"""`from_pretrained` for the encoder classes: find the checkpoint and build its config."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

logger = logging.getLogger(__name__)

HUB_KWARGS = ("revision", "cache_dir", "token")


def checkpoint_directory(model_name: str, **kwargs: Any) -> Path | None:
    """The local directory of a checkpoint (for files besides the weights), or None if there is none."""
    from hooked.loading.pretrained import _local_directory

    try:
        return _local_directory(model_name, **{k: kwargs[k] for k in HUB_KWARGS if k in kwargs})
    except FileNotFoundError:
        return None


def checkpoint_source(architecture, model_name: str, hf_model=None, dtype=torch.float32, device=None, **kwargs: Any):
    """`(cfg, source)` of a checkpoint of `architecture` (a `loading.registry.Architecture`).

    `model_name` is a local directory, a hub id in the local cache, or a name for `hf_model=`;
    `source` (a `loading.pretrained.Source`) holds the HF config, the tensors and the tokenizer path.
    """
    from hooked.core.config import HookedTransformerConfig
    from hooked.core.validation import to_dtype
    from hooked.loading.pretrained import hf_architecture, resolve_source

    if kwargs.get("load_in_8bit") or kwargs.get("load_in_4bit"):
        raise ValueError("Quantized loading is not supported; load in float32 or bfloat16")
    dtype = to_dtype(kwargs.pop("torch_dtype", None) or dtype or torch.float32)
    source = resolve_source(model_name, hf_model, **{k: kwargs[k] for k in HUB_KWARGS if k in kwargs})
    arch = hf_architecture(source.hf_config, hf_model)
    if arch != architecture.name:
        raise NotImplementedError(f"{model_name} is a {arch}; this class loads {architecture.name} checkpoints")
    fields = architecture.config(source.hf_config)
    fields.update(model_name=model_name, init_weights=False, dtype=dtype, device=device)
    return HookedTransformerConfig.from_dict(fields), source


def finish_loading(model, state: dict, device, move_to_device: bool, model_name: str):
    """Load `state` strictly (every parameter comes from the checkpoint) and move the model."""
    model.load_state_dict(state, strict=True)
    if move_to_device and device is not None:
        model.to(device)
    logger.info("Loaded pretrained model %s into %s", model_name, type(model).__name__)
    return model
