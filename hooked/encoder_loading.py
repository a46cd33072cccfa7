"""`from_pretrained` for the encoder classes: find the checkpoint, convert it with a pure converter."""

from __future__ import annotations

import logging
from typing import Any

import torch

logger = logging.getLogger(__name__)

HUB_KWARGS = ("revision", "cache_dir", "token")


def converted_checkpoint(architecture, model_name: str, hf_model=None, dtype=torch.float32, device=None, **kwargs: Any):
    """`(cfg, state_dict, tokenizer_path)` of a checkpoint of `architecture` (a `loading.registry.Architecture`).

    `model_name` is a local directory, a hub id in the local cache, or a name for `hf_model=`.
    """
    from hooked.config import HookedTransformerConfig
    from loading.pretrained import hf_architecture, resolve_source
    from hooked.validation import to_dtype

    if kwargs.get("load_in_8bit") or kwargs.get("load_in_4bit"):
        raise ValueError("Quantized loading is not supported; load in float32 or bfloat16")
    dtype = to_dtype(kwargs.pop("torch_dtype", None) or dtype or torch.float32)
    source = resolve_source(model_name, hf_model, **{k: kwargs[k] for k in HUB_KWARGS if k in kwargs})
    arch = hf_architecture(source.hf_config, hf_model)
    if arch != architecture.name:
        raise NotImplementedError(f"{model_name} is a {arch}; this class loads {architecture.name} checkpoints")
    fields = architecture.config(source.hf_config)
    fields.update(model_name=model_name, init_weights=False, dtype=dtype, device=device)
    cfg = HookedTransformerConfig.from_dict(fields)
    return cfg, architecture.weights(source.state, cfg), source.tokenizer_path


def load_encoder_model(cls, architecture, model_name, hf_model, device, tokenizer, move_to_device, dtype, **kwargs):
    """Build `cls(cfg, tokenizer)` and load the converted weights (strict: every parameter comes from the checkpoint)."""
    from loading.checkpoint import load_tokenizer

    cfg, state, tokenizer_path = converted_checkpoint(architecture, model_name, hf_model, dtype, device, **kwargs)
    if tokenizer is None and tokenizer_path is not None:
        tokenizer = load_tokenizer(tokenizer_path)
    model = cls(cfg, tokenizer, move_to_device=False)
    model.load_state_dict(state, strict=True)
    if move_to_device and device is not None:
        model.to(device)
    logger.info("Loaded pretrained model %s into %s", model_name, cls.__name__)
    return model
