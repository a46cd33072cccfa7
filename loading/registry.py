"""Registry of architecture converters, keyed by HuggingFace architecture class name.

A converter is two pure functions: HF config -> `HookedTransformerConfig` fields, and
(HF state dict, config) -> TransformerLens-format state dict. Neither instantiates a
model, so both can be tested on plain dicts and fed lazily from safetensors.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from hooked.core.errors import DuplicateArchitectureError, InputTypeError

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
    """Register one converter for each HF class in `hf_classes` (refusing a class already registered)."""
    _check_new(hf_classes)
    for name in hf_classes:
        ARCHITECTURES[name] = Architecture(name, config, weights)


def unregister_architecture(*hf_classes: str) -> None:
    """Forget the converters of `hf_classes` (either kind); unknown names are ignored.

    Replacing a family's converter is deliberate: unregister it, then register the new one.
    """
    for name in hf_classes:
        ARCHITECTURES.pop(name, None)
        MODEL_CLASS_ARCHITECTURES.pop(name, None)


def _check_new(hf_classes: tuple[str, ...]) -> None:
    """Refuse names that already have a converter (or repeat in `hf_classes`), before registering any."""
    if isinstance(hf_classes, str):  # ("LlamaForCausalLM") without its comma would register each letter
        raise InputTypeError(f"hf_classes must be a tuple of HF class names, got the string {hf_classes!r}")
    problems = [
        f"{name!r} is already registered (by {_owner(name)})"
        for name in dict.fromkeys(hf_classes)
        if name in ARCHITECTURES or name in MODEL_CLASS_ARCHITECTURES
    ]
    problems += [f"{name!r} is listed twice" for name, n in Counter(hf_classes).items() if n > 1]
    if problems:
        raise DuplicateArchitectureError(
            f"Cannot register {'; '.join(problems)}: a second converter would silently replace the first. "
            "Use a new HF class name, or call hooked.loading.registry.unregister_architecture(name) first."
        )


def _owner(name: str) -> str:
    arch = ARCHITECTURES[name] if name in ARCHITECTURES else MODEL_CLASS_ARCHITECTURES[name][1]
    return f"{getattr(arch.config, '__module__', '?')}.{getattr(arch.config, '__qualname__', arch.config)}"


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
    _check_new((hf_class,))
    arch = Architecture(hf_class, config, weights)
    MODEL_CLASS_ARCHITECTURES[hf_class] = (model_class, arch)
    return arch
