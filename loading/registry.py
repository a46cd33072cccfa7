"""Registry of architecture converters, keyed by HuggingFace architecture class name.

A converter is two pure functions: HF config -> `HookedTransformerConfig` fields, and
(HF state dict, config) -> TransformerLens-format state dict. Neither instantiates a
model, so both can be tested on plain dicts and fed lazily from safetensors.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

ConfigFn = Callable[[Any], dict]
WeightsFn = Callable[[Mapping[str, torch.Tensor], Any], dict[str, torch.Tensor]]


@dataclass(frozen=True)
class Architecture:
    """How to convert one family: `config(hf_config) -> dict`, `weights(hf_state, cfg) -> dict`."""

    name: str
    config: ConfigFn
    weights: WeightsFn


ARCHITECTURES: dict[str, Architecture] = {}


def register_architecture(hf_classes: tuple[str, ...], config: ConfigFn, weights: WeightsFn) -> None:
    for name in hf_classes:
        ARCHITECTURES[name] = Architecture(name, config, weights)


def get_architecture(hf_class: str) -> Architecture:
    if hf_class in MODEL_CLASS_ARCHITECTURES:
        model_class = MODEL_CLASS_ARCHITECTURES[hf_class][0]
        raise NotImplementedError(
            f"{hf_class} is not a decoder-only model: load it with hooked.{model_class}.from_pretrained"
        )
    if hf_class not in ARCHITECTURES:
        supported = ", ".join(sorted(ARCHITECTURES))
        raise NotImplementedError(
            f"Architecture {hf_class!r} is not supported. Supported HuggingFace architectures: {supported}."
        )
    return ARCHITECTURES[hf_class]


def supported_architectures() -> list[str]:
    return sorted(ARCHITECTURES)


# HF classes that another model class loads (never HookedTransformer): class -> (model class, converter)
MODEL_CLASS_ARCHITECTURES: dict[str, tuple[str, Architecture]] = {}


def register_model_class_architecture(
    hf_class: str, model_class: str, config: ConfigFn, weights: WeightsFn
) -> Architecture:
    """Register the converter of an HF class that `hooked.<model_class>` (not `HookedTransformer`) loads."""
    arch = Architecture(hf_class, config, weights)
    MODEL_CLASS_ARCHITECTURES[hf_class] = (model_class, arch)
    return arch
