"""`HookedEncoder.from_pretrained`: load a BERT-family checkpoint into `HookedEncoder`.

Encoder converters register with the other non-decoder classes (T5, HuBERT) in
`loading.registry.MODEL_CLASS_ARCHITECTURES` under the model class that loads them, so an
encoder never loads into `HookedTransformer` (which names `HookedEncoder` instead).
"""

from __future__ import annotations

import logging

import torch

from hooked.loading import bert, distilbert  # noqa: F401  (registers the encoder converters)
from hooked.loading.checkpoint import load_tokenizer
from hooked.loading.pretrained import hf_architecture, resolve_source
from hooked.loading.registry import MODEL_CLASS_ARCHITECTURES, Architecture
from hooked.loading.validation import check_converted_shapes, convert_checked, to_dtype, where_in

logger = logging.getLogger(__name__)

ENCODER_ARCHITECTURES: dict[str, Architecture] = {
    name: arch for name, (model_class, arch) in MODEL_CLASS_ARCHITECTURES.items() if model_class == "HookedEncoder"
}

HUB_ARGS = ("revision", "token", "cache_dir", "local_files_only")

# TransformerLens's BERT names -> hub repo ids (read from the HF cache when offline)
ENCODER_NAMES = {
    f"bert-{size}-{case}": f"google-bert/bert-{size}-{case}"
    for size in ("base", "large")
    for case in ("cased", "uncased")
}


def get_encoder_architecture(hf_class: str) -> Architecture:
    if hf_class not in ENCODER_ARCHITECTURES:
        supported = ", ".join(sorted(ENCODER_ARCHITECTURES))
        raise NotImplementedError(
            f"Architecture {hf_class!r} is not an encoder HookedEncoder supports. Supported: {supported}."
        )
    return ENCODER_ARCHITECTURES[hf_class]


def load_encoder(
    cls,
    model_name: str,
    hf_model=None,
    tokenizer=None,
    device: str | None = None,
    dtype: str | torch.dtype = "float32",
    move_to_device: bool = True,
    **kwargs,
):
    """Implementation of `HookedEncoder.from_pretrained` (see its docstring)."""
    from hooked.core.config import HookedTransformerConfig

    if kwargs.get("load_in_8bit") or kwargs.get("load_in_4bit"):
        raise ValueError("HookedEncoder does not load quantized checkpoints (load_in_8bit / load_in_4bit)")
    dtype = to_dtype(kwargs.pop("torch_dtype", dtype))
    hub_kwargs = {k: kwargs.pop(k) for k in HUB_ARGS if k in kwargs}
    unknown = [k for k in kwargs if k not in ("load_in_8bit", "load_in_4bit")]
    if unknown:
        raise TypeError(f"HookedEncoder.from_pretrained() got unexpected keyword arguments {unknown}")
    source = resolve_source(ENCODER_NAMES.get(model_name.lower(), model_name), hf_model, **hub_kwargs)
    arch_name = hf_architecture(source.hf_config, hf_model)
    arch = get_encoder_architecture(arch_name)
    fields = arch.config(source.hf_config)
    fields.update(
        model_name=model_name, init_weights=False, dtype=dtype, device=device, original_architecture=arch_name
    )
    cfg = HookedTransformerConfig.from_dict({k: v for k, v in fields.items() if v is not None})
    state, tracked = convert_checked(arch.weights, source.state, cfg, where_in(source.state))
    if tokenizer is None and source.tokenizer_path is not None:
        tokenizer = load_tokenizer(source.tokenizer_path)
    model = cls(cfg, tokenizer, move_to_device=False)
    check_converted_shapes({k: v.shape for k, v in model.state_dict().items()}, state, tracked)
    _check_complete(model, state, arch_name)
    model.load_state_dict(state, strict=False)
    model.missing_heads = set(bert.HEAD_PREFIXES) - bert.present_heads(state)
    if model.missing_heads:
        logger.info(
            "%s has no %s head(s): they stay at their random init and refuse to run",
            arch_name,
            ", ".join(sorted(model.missing_heads)),
        )
    if move_to_device:
        model.to(cfg.device)
    logger.info("Loaded pretrained model %s into HookedEncoder", model_name)
    return model


def _check_complete(model, state, arch_name: str) -> None:
    """Every weight outside the optional heads must come from the checkpoint."""
    heads = tuple(bert.HEAD_PREFIXES.values()) + ("unembed.",)
    missing = [k for k in model.state_dict() if k not in state and not k.startswith(heads)]
    if missing:
        raise KeyError(f"the {arch_name} checkpoint converted without {missing[:5]}: it is not a complete BERT")
