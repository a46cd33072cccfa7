"""`from_pretrained`: find a checkpoint, convert it, process it and build the model."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from hooked.core.errors import InputError, InputTypeError
from hooked.loading.checkpoint import (
    SafetensorsStateDict,
    has_tokenizer,
    load_hf_config,
    load_processor,
    load_tokenizer,
    safetensors_files,
)
from hooked.loading.options import LoadOptions
from hooked.loading.placed import load_placed, wants_placement
from hooked.loading.registry import get_architecture
from hooked.loading.validation import (  # noqa: F401  (check_from_pretrained_kwargs: importable from here before)
    check_converted_shapes,
    check_from_pretrained_kwargs,
    convert_checked,
    to_dtype,
    where_in,
)

logger = logging.getLogger(__name__)


@dataclass
class Source:
    """Where a checkpoint's pieces come from."""

    hf_config: Any
    state: Mapping[str, torch.Tensor]
    tokenizer_path: Path | None
    shared_with_user: bool  # tensors belong to a user's live HF model: never write into them


def resolve_source(model_name: str, hf_model=None, **hf_kwargs) -> Source:
    """An in-memory HF model, a bundled model name, a `.gguf` file, or a local checkpoint directory."""
    if hf_model is not None:
        path = Path(model_name)
        return Source(
            hf_model.config, hf_model.state_dict(), path if path.is_dir() and has_tokenizer(path) else None, True
        )
    directory = _local_directory(model_name, **hf_kwargs)
    files = safetensors_files(directory)
    return Source(
        load_hf_config(directory), SafetensorsStateDict(files), directory if has_tokenizer(directory) else None, False
    )


def _local_directory(model_name: str, **hf_kwargs) -> Path:
    from hooked.loading import bundled, gguf
    from hooked.loading.model_names import get_official_model_name, hub_checkpoint_dir

    key = bundled.resolve_bundled_name(model_name)
    if key is not None:
        return bundled.bundled_checkpoint_dir(key)
    path = Path(model_name).expanduser()
    if path.suffix == ".gguf" or (path.is_dir() and any(path.glob("*.gguf")) and not any(path.glob("*.safetensors"))):
        return bundled.gguf_checkpoint_dir(gguf.find_gguf_file(path))
    if path.is_dir():
        return path
    try:
        return hub_checkpoint_dir(get_official_model_name(model_name), **hf_kwargs)  # a TL name or a hub repo id
    except FileNotFoundError as e:
        raise _not_found(model_name, e) from e


def _not_found(model_name: str, error: FileNotFoundError) -> FileNotFoundError:
    """The hub lookup's error, naming what is available offline (and the bundled fine-tune of a base name)."""
    from hooked.loading import bundled

    key = bundled.base_model_of(model_name)
    if key is None:
        return FileNotFoundError(f"{error} Bundled models (available offline): {bundled.bundled_names()}")
    tuned = bundled.BUNDLED_MODELS[key]
    return FileNotFoundError(
        f"{model_name!r} names the base model {tuned.base_names[0]}, which is not bundled and was not found offline "
        f"(no local directory, not in the HF cache). The bundled model is {tuned.name}, the instruction-tuned one: "
        f"load it as from_pretrained({tuned.name!r}) (or {key!r}), or put the base model's checkpoint in the HF cache."
    )


def describe_source(model_name: str) -> str:
    """`model_name`, with what it is when it names a bundled model: `smollm2-135m (SmolLM2-135M-Instruct, bundled)`."""
    from hooked.loading import bundled

    if bundled.resolve_bundled_name(model_name) is None:
        return model_name
    return f"{model_name} ({bundled.display_name(model_name)}, bundled)"


def hf_architecture(hf_config, hf_model=None) -> str:
    if hf_model is not None:
        return type(hf_model).__name__
    archs = getattr(hf_config, "architectures", None) or []
    if not archs:
        raise ValueError("The HF config names no `architectures`; pass hf_model= so the class is known")
    return archs[0]


def build_config(hf_config, arch_name: str, model_name: str, **overrides):
    from hooked.core.config import HookedTransformerConfig
    from hooked.loading.bundled import display_name

    fields = get_architecture(arch_name).config(hf_config)
    fields.update(model_name=display_name(model_name), init_weights=False)  # a bundled model: what it is
    fields.update({k: v for k, v in overrides.items() if v is not None})
    return HookedTransformerConfig.from_dict(fields)


def load_pretrained(cls, model_name: str, options: LoadOptions | None = None):
    """Implementation of `HookedTransformer.from_pretrained` (see its docstring), with its options in one object."""
    from hooked.loading.checkpoints import resolve_checkpoint

    options = LoadOptions() if options is None else options
    if not isinstance(options, LoadOptions):
        raise InputTypeError(f"options must be a hooked.loading.options.LoadOptions, got {type(options).__name__}")
    hf_model, hub_kwargs = options.hf_model, options.hub_kwargs
    where, checkpoint_fields = resolve_checkpoint(model_name, **options.checkpoints, hf_model=hf_model, **hub_kwargs)
    source = resolve_source(where, hf_model, **hub_kwargs)
    arch_name = hf_architecture(source.hf_config, hf_model)
    cfg = build_config(
        source.hf_config,
        arch_name,
        model_name,
        n_ctx=options.n_ctx,
        n_layers=options.first_n_layers,
        default_prepend_bos=options.default_prepend_bos,
        dtype=to_dtype(options.dtype),
        device=options.device,
        n_devices=options.n_devices,
        **checkpoint_fields,
    )
    if wants_placement(**options.placement, n_devices=cfg.n_devices):
        if cfg.vision_language is not None:
            raise InputError(
                f"{arch_name} is an image-text model: device_map, max_memory, offload_folder and n_devices are not "
                "supported for it yet; load it whole on one device (device=...)"
            )
        return _load_placed(cls, cfg, source, arch_name, options)
    protected = (
        frozenset(t.untyped_storage().data_ptr() for t in source.state.values())
        if source.shared_with_user
        else frozenset()
    )
    state, tracked = convert_checked(get_architecture(arch_name).weights, source.state, cfg, where_in(source.state))
    tokenizer = options.tokenizer
    if tokenizer is None and source.tokenizer_path is not None:
        tokenizer = load_tokenizer(source.tokenizer_path)
    model_class = cls.model_class_for(cfg)  # an image-text config: HookedVisionLanguageModel
    model = model_class(cfg, tokenizer, move_to_device=False, default_padding_side=options.default_padding_side)
    if cfg.vision_language is not None and source.tokenizer_path is not None:  # image-text: the processor too
        setattr(model, "processor", load_processor(source.tokenizer_path))  # noqa: B010 - set on the subclass only
    check_converted_shapes({k: v.shape for k, v in model.state_dict().items()}, state, tracked)
    model.load_and_process_state_dict(state, **options.processing, owned=True, protected_storages=protected)
    if options.move_to_device:
        model.to(cfg.device)
    logger.info("Loaded %s into HookedTransformer", describe_source(model_name))
    return model


def _load_placed(cls, cfg, source: Source, arch_name: str, options: LoadOptions):
    """`from_pretrained` with a device map or offload: each part converted, processed and placed alone."""
    tokenizer = options.tokenizer
    if tokenizer is None and source.tokenizer_path is not None:
        tokenizer = load_tokenizer(source.tokenizer_path)
    if options.move_to_device is False:
        raise ValueError("move_to_device=False cannot be combined with device_map/max_memory/offload_folder/n_devices")
    model = load_placed(
        cls,
        cfg,
        source.state,
        get_architecture(arch_name).weights,
        where_in(source.state),
        tokenizer=tokenizer,
        default_padding_side=options.default_padding_side,
        flags=options.processing,
        n_devices=cfg.n_devices,
        **options.placement,
    )
    logger.info("Loaded %s over %s", describe_source(cfg.model_name), sorted(set(model.hf_device_map.values())))
    return model


def _dtype(dtype) -> torch.dtype:
    return to_dtype(dtype)
