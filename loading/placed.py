"""`from_pretrained(device_map=..., max_memory=..., offload_folder=..., n_devices=N)`: load straight into place.

The model is built on the `meta` device (no memory), its placement planned from the parts'
sizes, and then each part is converted and processed alone (`loading/streaming.py`) and
written straight to its device or to its offload file. At no point does the whole model
sit in memory or on one device; the peak is about one block plus the parts kept in memory.
Finally `hooked.placement.dispatch.dispatch` attaches accelerate's hooks.
"""

from __future__ import annotations

import copy
import logging
import os
from collections.abc import Callable, Mapping

import torch
import torch.nn as nn

from hooked.core.dtypes import cast_parameter, parameter_requires_grad
from hooked.core.errors import WeightShapeError
from hooked.loading.streaming import iter_processed_parts, processing_steps
from hooked.placement.dispatch import model_cfg

logger = logging.getLogger(__name__)

PLACEMENT_ARGS = ("device_map", "max_memory", "offload_folder")


def wants_placement(device_map=None, max_memory=None, offload_folder=None, n_devices: int = 1) -> bool:
    return device_map is not None or max_memory is not None or offload_folder is not None or (n_devices or 1) > 1


def load_placed(
    cls,
    cfg,
    state: Mapping[str, torch.Tensor],
    convert: Callable,
    where: Callable[[str], str],
    *,
    tokenizer=None,
    default_padding_side: str = "right",
    flags: Mapping[str, bool],
    device_map=None,
    max_memory=None,
    offload_folder=None,
    n_devices: int = 1,
    reads: list[str] | None = None,
):
    """A model of class `cls` whose parts are loaded one at a time onto the planned devices and files."""
    from hooked.placement.dispatch import dispatch, require_accelerate, resolve_device_map

    accelerate = require_accelerate()
    with accelerate.init_empty_weights():
        model = cls(cfg, tokenizer, move_to_device=False, default_padding_side=default_padding_side)
    source_cfg = copy.deepcopy(model.cfg)  # before processing changes the norms in the config
    steps = processing_steps(model.cfg, flags)
    model.record_weight_processing(steps)  # the norms become LNPre/RMSPre after fold_ln, as the tensors will be
    plan = resolve_device_map(model, device_map, max_memory, n_devices) or _single(model, cfg)
    if "disk" in plan.values() and offload_folder is None:
        raise ValueError(
            f"the placement offloads {sum(d == 'disk' for d in plan.values())} parts to disk: pass offload_folder=DIR "
            "for their files (or a larger max_memory)"
        )
    expected = {k: v.shape for k, v in model.state_dict(keep_vars=True).items()}
    index, placed = {}, set()
    for _part, tensors in iter_processed_parts(convert, state, source_cfg, steps, where, reads):
        _check_shapes(tensors, expected)
        placed |= _place(model, tensors, plan, offload_folder, index)
        del tensors
    _check_complete(expected, placed)
    if index:
        from accelerate.utils import save_offload_index

        save_offload_index(index, offload_folder)
    dispatch(model, plan, offload_folder, offload_index=index or None)
    keep_layouts(model)
    return model


def _single(model, cfg) -> dict[str, str]:
    from hooked.placement.dispatch import model_parts

    device = str(cfg.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    return dict.fromkeys(model_parts(model), device)


def _part_of(key: str) -> str:
    """The device-map entry owning a state-dict key: `blocks.3.attn.W_Q` -> `blocks.3`, `embed.W_E` -> `embed`."""
    parts = key.split(".")
    return ".".join(parts[:2]) if parts[0] == "blocks" else parts[0]


def _check_shapes(tensors: Mapping[str, torch.Tensor], expected: Mapping[str, torch.Size]) -> None:
    for key, tensor in tensors.items():
        if key in expected and tuple(tensor.shape) != tuple(expected[key]):
            raise WeightShapeError(
                f"{key}: the checkpoint gives shape {tuple(tensor.shape)}, the config expects {tuple(expected[key])}"
            )


def _check_complete(expected: Mapping[str, torch.Size], placed: set[str]) -> None:
    missing, unexpected = set(expected) - placed, placed - set(expected)
    if missing or unexpected:
        raise KeyError(f"State dict mismatch: missing {sorted(missing)[:8]}, unexpected {sorted(unexpected)[:8]}")


def _place(
    model: nn.Module, tensors: dict[str, torch.Tensor], plan: Mapping[str, str], folder, index: dict
) -> set[str]:
    """Put each tensor on its part's device, or into the offload folder; returns the keys placed."""
    tied = "unembed.W_U" in tensors and "embed.W_E" in tensors and _shares(tensors["embed.W_E"], tensors["unembed.W_U"])
    placed = set()
    for key in list(tensors):
        tensor = tensors.pop(key)
        module_name, leaf = key.rsplit(".", 1)
        device = plan[_part_of(key)]
        module = model.get_submodule(module_name)
        placed.add(key)
        if device == "disk" and leaf not in module._buffers:
            _offload(cast_parameter(module, leaf, tensor, model_cfg(model).dtype), key, folder, index)
            continue
        target = device if device != "disk" else "cpu"
        if tied and key == "unembed.W_U" and (w_e := model.get_parameter("embed.W_E")).device == torch.device(target):
            module._parameters[leaf] = nn.Parameter(w_e.T, requires_grad=parameter_requires_grad(module, leaf))
            continue
        tensor = cast_parameter(module, leaf, tensor, model_cfg(model).dtype, target)
        if leaf in module._buffers:
            module._buffers[leaf] = tensor
        else:
            module._parameters[leaf] = nn.Parameter(tensor, requires_grad=parameter_requires_grad(module, leaf))
    return placed


def _offload(tensor: torch.Tensor, key: str, folder, index: dict, chunk_bytes: int = 1 << 24) -> None:
    """Write `tensor` as accelerate's offload file `<folder>/<key>.dat` and record it in `index`.

    A tensor whose memory order is a permutation of its axes (`W_U` vocabulary-major, Q/K/V
    head-major) is written in that order and its `permutation` recorded, so the paged-in tensor
    has the same strides, and the matmuls the same summation order, as in the model held in
    memory. Written in row chunks with plain file writes: no whole-tensor copy or file mapping.
    """
    os.makedirs(folder, exist_ok=True)
    order = sorted(range(tensor.ndim), key=lambda d: -tensor.stride(d))  # axes from outermost in memory
    permuted = order != list(range(tensor.ndim)) and tensor.permute(order).is_contiguous()
    stored = tensor.permute(order) if permuted else tensor
    kind = "bfloat16" if tensor.dtype == torch.bfloat16 else str(tensor.dtype).removeprefix("torch.")
    raw = stored.view(torch.int16) if tensor.dtype == torch.bfloat16 else stored  # numpy has no bfloat16
    index[key] = {"dtype": kind, "shape": list(stored.shape), **({"permutation": order} if permuted else {})}
    rows = raw.reshape(1) if raw.ndim == 0 else raw
    step = max(1, chunk_bytes // max(1, rows[0].numel() * rows.element_size()))
    with open(os.path.join(folder, f"{key}.dat"), "wb") as f:
        for start in range(0, rows.shape[0], step):
            f.write(rows[start : start + step].contiguous().numpy().tobytes())


def keep_layouts(model: nn.Module) -> None:
    """Make the model's offload loader return `permutation` entries as the permuted views they were."""
    from accelerate.utils import OffloadedWeightsLoader

    class LayoutLoader(OffloadedWeightsLoader):
        def __getitem__(self, key: str) -> torch.Tensor:
            tensor = super().__getitem__(key)
            order = self.index.get(key, {}).get("permutation")
            if order is None:
                return tensor
            inverse = sorted(range(len(order)), key=order.__getitem__)
            return tensor.permute(inverse)

    for module in model.modules():
        loader = getattr(getattr(getattr(module, "_hf_hook", None), "weights_map", None), "dataset", None)
        if isinstance(loader, OffloadedWeightsLoader) and not isinstance(loader, LayoutLoader):
            loader.__class__ = LayoutLoader


def _shares(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.device.type != "meta" and a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
