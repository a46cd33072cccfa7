"""`transformer_lens.utilities` and its submodules (activation functions, addmm, attention, devices)."""

from __future__ import annotations

import torch
from jaxtyping import Float

from hooked.compat.utils import (  # noqa: F401
    ACTIVATION_FN_DICT,
    XIELU,
    gelu_fast,
    gelu_new,
    gelu_pytorch_tanh,
    get_device,
    xielu,
)
from hooked.components.activations import solu  # noqa: F401
from hooked.components.attention import project
from hooked.core.config import HookedTransformerConfig

__path__: list[str] = []
SUPPORTED_ACTIVATIONS = ACTIVATION_FN_DICT
ActivationFunction = object


def simple_attn_linear(
    input: Float[torch.Tensor, "batch pos d_model"],
    w: Float[torch.Tensor, "head_index d_model d_head"],
    b: Float[torch.Tensor, "head_index d_head"],
) -> Float[torch.Tensor, "batch pos head_index d_head"]:
    """`input @ w[h] + b[h]` for every head."""
    return project(input, w.to(input.device), b.to(input.device))


def complex_attn_linear(
    input: Float[torch.Tensor, "batch pos head_index d_model"],
    w: Float[torch.Tensor, "head_index d_model d_head"],
    b: Float[torch.Tensor, "head_index d_head"],
) -> Float[torch.Tensor, "batch pos head_index d_head"]:
    """Per-head inputs: `input[:, :, h] @ w[h] + b[h]`."""
    return project(input, w, b)


def vanilla_addmm(input, mat1, mat2):
    return torch.addmm(input, mat1, mat2)


def batch_addmm(bias, weight, x):
    """`x @ weight + bias` over any leading axes (HF's Conv1D arithmetic)."""
    return torch.addmm(bias, x.reshape(-1, x.shape[-1]), weight).view(*x.shape[:-1], weight.shape[-1])


def calculate_available_device_cuda_memory(i: int) -> int:
    return torch.cuda.get_device_properties(i).total_memory - torch.cuda.memory_allocated(i)


def determine_available_memory_for_available_devices(max_devices: int) -> list[tuple[int, int]]:
    """`[(device index, free bytes)]` for the first `max_devices` CUDA devices."""
    return [(i, calculate_available_device_cuda_memory(i)) for i in range(min(max_devices, torch.cuda.device_count()))]


def sort_devices_based_on_available_memory(devices: list[tuple[int, int]]) -> list[tuple[int, int]]:
    return sorted(devices, key=lambda d: d[1], reverse=True)


def get_best_available_cuda_device(max_devices: int | None = None) -> torch.device:
    devices = sort_devices_based_on_available_memory(
        determine_available_memory_for_available_devices(max_devices or torch.cuda.device_count())
    )
    if not devices:
        raise OSError("No CUDA devices available")
    return torch.device("cuda", devices[0][0])


def get_device_for_block_index(index: int, cfg, device=None) -> torch.device:
    """The device of block `index` when `cfg.n_layers` blocks are split contiguously over `cfg.n_devices`."""
    device = torch.device(device if device is not None else cfg.device)
    if device.type == "cpu":
        return device
    layers_per_device = -(-cfg.n_layers // cfg.n_devices)
    return torch.device(device.type, (device.index or 0) + index // layers_per_device)


def get_best_available_device(cfg) -> torch.device:
    device = torch.device(cfg.device)
    return device if device.type != "cuda" else torch.device("cuda", 0)


def move_to_and_update_config(model, device_or_dtype, print_details: bool = True):
    return model.to(device_or_dtype, print_details=print_details)


class ActivationFunctionFactory:
    @staticmethod
    def pick_activation_function(cfg: HookedTransformerConfig):
        if cfg.act_fn is None:
            raise ValueError("act_fn not set when trying to select Activation Function")
        if cfg.act_fn == "xielu":  # trainable: an instance, so its parameters register on the MLP
            return XIELU()
        if cfg.act_fn not in ACTIVATION_FN_DICT:
            raise ValueError(f"Invalid activation function name: {cfg.act_fn}")
        return ACTIVATION_FN_DICT[cfg.act_fn]
