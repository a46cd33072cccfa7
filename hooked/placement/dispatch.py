"""Placing a model over devices and offloading it to CPU or disk, with HF accelerate.

`dispatch(model, device_map)` hands `hooked`'s own modules to `accelerate.dispatch_model`:
each top-level part (`embed`, `blocks.i`, `ln_final`, `unembed`) gets an `AlignDevicesHook`
that moves its inputs to the part's execution device and, for offloaded parts, pages its
weights in for the forward and back out after. Blocks are never split, and the KV cache
is never moved by those hooks (`skip_keys`, and it travels inside `ForwardState`, whose
`.to` leaves it in place). `accelerate` is an optional dependency (`pip install hooked[scale]`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import cast

import torch
import torch.nn as nn

from hooked.core.config import HookedTransformerConfig
from hooked.placement.plan import OFFLOAD_DEVICES, check_contiguous, devices_in_order, plan_device_map

logger = logging.getLogger(__name__)

SKIP_KEYS = ["past_kv_cache"]  # never moved by accelerate's input hooks: one KV entry per layer, on its layer


def require_accelerate():
    try:
        import accelerate
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(
            "device_map, max_memory, offload_folder and n_devices > 1 need HF accelerate: pip install 'hooked[scale]' "
            "(or pip install accelerate)"
        ) from e
    return accelerate


def model_cfg(model: nn.Module) -> HookedTransformerConfig:
    """The `cfg` of a hooked model (this layer sits below `hooked.models`, so models arrive as `nn.Module`)."""
    return cast(HookedTransformerConfig, model.cfg)


# -- parts and sizes ---------------------------------------------------------------------------
def model_parts(model: nn.Module) -> list[str]:
    """Names of the model's top-level parts that hold tensors, in forward order (`blocks` expanded)."""
    parts = []
    for name, child in model.named_children():
        if name == "blocks":
            parts.extend(f"blocks.{i}" for i in range(len(cast(nn.ModuleList, child))))
        elif any(True for _ in child.parameters()) or any(True for _ in child.buffers()):
            parts.append(name)
    return parts


def part_sizes(model: nn.Module, dtype: torch.dtype | None = None) -> dict[str, int]:
    """Bytes of each part's parameters and buffers (in `dtype` when given; works on a `meta` model)."""
    sizes = {}
    for name in model_parts(model):
        tensors = [*model.get_submodule(name).parameters(), *model.get_submodule(name).buffers()]
        sizes[name] = sum(t.numel() * (dtype or t.dtype).itemsize for t in tensors if t.is_floating_point())
    return sizes


def resolve_device_map(
    model: nn.Module,
    device_map: str | Mapping[str, str | int] | None = None,
    max_memory: Mapping[str | int, int | str] | None = None,
    n_devices: int = 1,
) -> dict[str, str] | None:
    """The `{part: device}` map asked for by `from_pretrained`'s arguments, or None for a plain one-device model.

    `n_devices=N` is TransformerLens's balanced split over `cuda:0` ... `cuda:N-1`; `device_map`
    and `max_memory` have HF's meaning (`"auto"`/`"balanced"` spread over the GPUs, then CPU, then disk).

    Args:
        model: the model to place (its config and parameter sizes are read, nothing moves).
        device_map: "auto", "balanced", "sequential", or `{part: device}` over `embed`, `pos_embed`,
            `blocks.{i}`, `ln_final`, `unembed` (`""` for the whole model).
        max_memory: `{device: bytes or "200MB"}` budgets (default: accelerate's `get_max_memory()`, what is available).
        n_devices: TransformerLens's split over this many GPUs, when `device_map` is None.

    Returns:
        `{part: device}` (devices such as `"cuda:0"`, `"cpu"`, `"disk"`), or None.
    """
    n_layers = model_cfg(model).n_layers
    sizes = part_sizes(model, model_cfg(model).dtype)
    if isinstance(device_map, Mapping):
        return _complete_user_map(model, device_map)
    if device_map is None and max_memory is None:
        if n_devices <= 1:
            return None
        _check_cuda(n_devices)
        return plan_device_map(n_layers, n_devices, sizes=sizes)
    if device_map not in (None, "auto", "balanced", "sequential"):
        raise ValueError(f"device_map must be a dict, 'auto', 'balanced' or 'sequential', got {device_map!r}")
    if max_memory is None:
        max_memory = _detected_memory()
        gpus = [k for k in max_memory if isinstance(k, int)]
        if len(gpus) > 1 and device_map != "sequential" and _fits(sizes, max_memory, gpus):
            return plan_device_map(n_layers, len(gpus), sizes=sizes, devices=[f"cuda:{g}" for g in gpus])
    return plan_device_map(n_layers, max_memory=max_memory, sizes=sizes)


def _complete_user_map(model: nn.Module, device_map: Mapping[str, str | int]) -> dict[str, str]:
    """A user's map: ints become `cuda:i`; parts not named inherit the device of a named parent (`""` = all)."""
    named = {k: (f"cuda:{v}" if isinstance(v, int) else str(v)) for k, v in device_map.items()}
    unknown = [k for k in named if k and not _is_module(model, k)]
    if unknown:
        raise ValueError(
            f"device_map names {unknown[:4]}, which are not modules of this model; parts: {model_parts(model)[:6]}..."
        )
    out = {}
    for part in model_parts(model):
        owner = next((k for k in (part, part.rsplit(".", 1)[0], "") if k in named), None)
        if owner is None:
            raise ValueError(f"device_map gives no device for {part!r}: name it (or its parent, or '' for all)")
        out[part] = named[owner]
    check_contiguous(out, model_cfg(model).n_layers)
    return out


def _is_module(model: nn.Module, name: str) -> bool:
    try:
        model.get_submodule(name)
        return True
    except AttributeError:
        return False


def _check_cuda(n: int) -> None:
    available = torch.cuda.device_count()
    if available < n:
        raise ValueError(f"n_devices={n} needs {n} CUDA devices, but {available} are visible: lower n_devices")


def _detected_memory() -> dict:
    from accelerate.utils import get_max_memory

    return get_max_memory()


def _fits(sizes: Mapping[str, int], max_memory: Mapping, gpus: list[int]) -> bool:
    return sum(sizes.values()) <= sum(max_memory[g] for g in gpus) * 0.9


# -- dispatch ----------------------------------------------------------------------------------
def main_device(device_map: Mapping[str, str]) -> str:
    """Where offloaded parts execute: the first accelerator of the map, else the CPU."""
    return next((d for d in devices_in_order(device_map) if d not in OFFLOAD_DEVICES), "cpu")


def dispatch(
    model: nn.Module,
    device_map: Mapping[str, str],
    offload_folder: str | None = None,
    offload_index: dict | None = None,
) -> nn.Module:
    """Attach accelerate's device hooks to `model` per `device_map` (`{part: device}`) and record the map.

    Parts on `"disk"` are paged in from `offload_folder` per forward (written there first unless
    `offload_index` says they already are). After this, `model.hf_device_map` is the map and
    `model.cfg.device` the main device.

    Args:
        model: the model built in memory.
        device_map: `{part: device}`, e.g. from `resolve_device_map`.
        offload_folder: where the parts placed on "disk" are written (required if there are any).
        offload_index: accelerate's index of weights already written to `offload_folder`.

    Returns:
        The same model, placed.
    """
    accelerate = require_accelerate()
    device_map = dict(device_map)
    if "disk" in device_map.values() and offload_folder is None:
        raise ValueError("device_map offloads parts to 'disk': pass offload_folder=DIR for their files")
    main = main_device(device_map)
    accelerate.dispatch_model(
        model,
        device_map=cast("dict[str, str | int | torch.device]", device_map),  # accelerate's dict is invariant
        main_device=main,  # pyright: ignore[reportArgumentType] - accelerate annotates torch.device, reads "cpu"/"cuda:0" too
        offload_dir=offload_folder,
        offload_index=offload_index,
        skip_keys=SKIP_KEYS,
        force_hooks=len(set(device_map.values())) > 1,
        # each part pages in all its weights when its forward starts: modules read their children's
        # weights directly (an MoE's router and experts), which per-submodule hooks would leave on `meta`
        preload_module_classes=sorted({type(model.get_submodule(part)).__name__ for part in device_map}),
    )
    setattr(model, "hf_device_map", device_map)  # noqa: B010 - a plain attribute; nn.Module's __setattr__ is typed for Tensor/Module
    model_cfg(model).device = main
    logger.info("Dispatched %d parts over %s", len(device_map), devices_in_order(device_map))
    return model


# -- reading placed weights --------------------------------------------------------------------
def execution_device(module: nn.Module) -> torch.device | None:
    """The device `module` computes on: its accelerate hook's execution device, else its first tensor's device."""
    device = getattr(getattr(module, "_hf_hook", None), "execution_device", None)
    if device is not None:
        return torch.device(device if not isinstance(device, int) else f"cuda:{device}")
    for tensor in module.parameters():
        return tensor.device
    return None


def read_weight(owner: nn.Module, name: str) -> torch.Tensor:
    """`owner.<name>` (a dotted path; a parameter or a derived view such as GQA's `W_K`).

    An offloaded module's parameters are on `meta` between forwards: they are paged in for
    the read (accelerate's `align_module_device`) and out again; the returned tensor stays valid.
    """
    module_path, _, leaf = name.rpartition(".")
    holder = owner.get_submodule(module_path) if module_path else owner
    tensor = getattr(holder, leaf)
    if tensor.device.type != "meta":
        return tensor
    paged = _offload_hook_holder(owner, module_path)  # the part whose hook pages this weight in
    if paged is None:
        raise RuntimeError(f"{name} is on the meta device and no offload hook holds its data")
    from accelerate.utils import align_module_device

    with align_module_device(paged):
        return getattr(holder, leaf)


def _offload_hook_holder(owner: nn.Module, module_path: str) -> nn.Module | None:
    """The innermost module on `module_path` (itself or an ancestor) with an accelerate hook."""
    parts = module_path.split(".") if module_path else []
    for depth in range(len(parts), -1, -1):
        module = owner.get_submodule(".".join(parts[:depth])) if depth else owner
        if getattr(module, "_hf_hook", None) is not None:
            return module
    return None
