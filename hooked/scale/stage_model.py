"""Building one pipeline stage's model: the converters run on a per-stage view, the rest stays on `meta`.

See `stage_loading.py` for how the checkpoint keys of a stage are chosen. Here the model
is built on `meta`, this stage's parts are rebuilt for real, the converted tensors are
processed (other stages' as shape-only meta tensors) and adopted as the stage's weights.
"""

from __future__ import annotations

import logging

import torch

from hooked.core.dtypes import cast_parameter
from hooked.core.errors import InputError
from hooked.loading.options import LoadOptions
from hooked.scale.stage_loading import (
    _FIRST_MODULES,
    _LAST_MODULES,
    Stage,
    StageStateView,
    checkpoint_fingerprint,
    make_stage,
    meta_except_owned,
    needed_keys,
)

logger = logging.getLogger(__name__)


def load_stage(cls, model_name: str, rank: int, world_size: int, stage_device: torch.device, options: LoadOptions):
    """A `cls` model holding real weights only for stage `rank` of `world_size` (see module doc).

    `options` were validated for a pipeline when built (no `device=`, no `n_devices=`).
    """
    from hooked.loading.checkpoint import load_tokenizer
    from hooked.loading.checkpoints import resolve_checkpoint
    from hooked.loading.pretrained import build_config, hf_architecture, resolve_source
    from hooked.loading.registry import get_architecture
    from hooked.loading.validation import check_converted_shapes, to_dtype

    device = stage_device
    hf_model, tokenizer, hub_kwargs = options.hf_model, options.tokenizer, options.hub_kwargs
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
        device=str(device),
        **checkpoint_fields,
    )
    if cfg.vision_language is not None:  # its vision tower and projector belong to no stage of the text blocks
        raise InputError(
            f"{arch_name} is an image-text model: pipeline=True is not supported for it yet; load it whole on one "
            "device (device=...)"
        )
    stage = make_stage(cfg.n_layers, world_size, rank)
    convert = get_architecture(arch_name).weights
    try:
        view, state, tracked = _convert_stage(
            convert, source.state, cfg, stage, needed_keys(convert, source.state, cfg, stage)
        )
    except Exception as e:  # a converter that reads values of tensors it was given as meta: read them all
        logger.warning(
            "rank %d: converting with other stages' tensors on meta failed (%s); reading every tensor", rank, e
        )
        view, state, tracked = _convert_stage(convert, source.state, cfg, stage, set(source.state))
    protected = (
        frozenset(source.state[k].untyped_storage().data_ptr() for k in view.needed)
        if source.shared_with_user
        else frozenset()
    )
    if tokenizer is None and source.tokenizer_path is not None:
        tokenizer = load_tokenizer(source.tokenizer_path)
    model = build_stage_model(cls, cfg, tokenizer, stage, options.default_padding_side)
    expected = {k: v.shape for k, v in model.state_dict().items() if stage.owns_name(k)}
    check_converted_shapes(expected, state, tracked)
    _process_and_adopt(model, state, stage, device, options.processing, protected)
    model.stage, model.device, model.requested_keys = stage, device, view.requested
    model.fingerprint = checkpoint_fingerprint(source.state, source.hf_config)
    logger.info(
        "rank %d: loaded blocks %s of %s (%d tensors read)", rank, list(stage.layers), model_name, len(view.requested)
    )
    return model


def _convert_stage(convert, source_state, cfg, stage: Stage, needed: set[str]):
    """`(view, converted state with only this stage's tensors real, tracked)`, reading only `needed`."""
    from hooked.loading.validation import convert_checked

    view = StageStateView(source_state, needed)
    state, tracked = convert_checked(convert, view, cfg, lambda key: str(view.file_of(key)))
    return view, meta_except_owned(state, stage), tracked


def build_stage_model(cls, cfg, tokenizer, stage: Stage, padding_side: str):
    """The model built on `meta` (no memory, no initialisation), then this stage's parts rebuilt for real.

    Only the owned blocks (and embedding / final norm / unembedding on the end stages) are
    constructed on the CPU, so no rank ever allocates, let alone initialises, another
    stage's weights (MoE experts are `nn.Linear`s, which initialise when built).
    """
    from hooked.components import Embed, PosEmbed, Unembed
    from hooked.components.norms import make_norm
    from hooked.components.post_norm_block import block_class
    from hooked.processing.steps import final_norm_kind

    with torch.device("meta"):
        model = cls(cfg, tokenizer, move_to_device=False, default_padding_side=padding_side)
    for layer in stage.layers:
        model.blocks[layer] = block_class(cfg)(cfg, layer)
    if stage.is_first:
        model.embed = Embed(cfg)
        if hasattr(model, "pos_embed"):
            model.pos_embed = PosEmbed(cfg)
    if stage.is_last:
        if hasattr(model, "ln_final"):
            model.ln_final = make_norm(cfg, final_norm_kind(cfg))
        model.unembed = Unembed(cfg)
    model.setup()  # hook names of the rebuilt modules
    return model


def _process_and_adopt(model, state: dict, stage: Stage, device: torch.device, flags: dict, protected) -> None:
    """Process weights (other stages' tensors are meta: shape-only), keep this stage's, free the rest."""
    from hooked.processing.steps import process_state_dict

    state, steps = process_state_dict(model.cfg, state, **flags, in_place=True, protected_storages=protected)
    model.record_weight_processing(steps)
    for name in list(state):
        tensor = state.pop(name)
        if not stage.owns_name(name):
            continue
        module_name, leaf = name.rsplit(".", 1)
        module = model.get_submodule(module_name)
        tensor = cast_parameter(module, leaf, tensor, model.cfg.dtype, device)
        if tensor.untyped_storage().data_ptr() in protected:
            tensor = tensor.clone()
        if leaf in module._buffers:
            module._buffers[leaf] = tensor
        else:
            module._parameters[leaf] = torch.nn.Parameter(tensor, requires_grad=module._parameters[leaf].requires_grad)
    for _name, module in _stage_modules(model, stage, owned=False):
        module.to("meta")
    for _name, module in _stage_modules(model, stage, owned=True):
        module.to(device)  # buffers (rotary tables) of the owned modules


def _stage_modules(model, stage: Stage, owned: bool):
    """`(name, module)` of the top-level parts (blocks, embeddings, final norm, unembed) owned or not here."""
    for name, module in model.named_children():
        if name == "blocks":
            for i, block in enumerate(module):
                if (i in stage.layers) == owned:
                    yield f"blocks.{i}", block
        elif name in _FIRST_MODULES + _LAST_MODULES and stage.owns_name(name) == owned:
            yield name, module
