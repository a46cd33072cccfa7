"""Pieces of the static-cache generation path: the compile-safe hook protocol, device-side step
gates, a recorder writing activations into preallocated buffers, and the compiled decode step.

`generate(..., cache_implementation="static")` decodes with a `StaticKeyValueCache`: every
decode step has the same shapes, so with `compile=True` it is traced once by
`torch.compile` (on CUDA with `mode="reduce-overhead"`: a CUDA graph replayed per token).

Hooks run inside the compiled step only when they are *declarative*: made of tensor ops,
with no Python decision on tensor values, no host sync and no in-place edit of the
activation. A hook says so by being a `torch.nn.Module`, or by a true `compile_safe`
attribute (`@compile_safe`). Any other hook makes the decode steps run eagerly, with one
warning naming it. `at_steps(fn, steps)` around a compile-safe `fn` becomes a device-side
gate: the step counter is a device tensor, `fn` runs at every step and its output is kept
only at the chosen steps.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn as nn
from jaxtyping import Float

from hooked.core.utils import AtSteps


@dataclass(frozen=True)
class StaticCacheOptions:
    """Tuning of `generate(..., cache_implementation="static")`.

    Attributes:
        stop_check_interval: check the stop condition (every row finished) once every this
            many tokens: one host sync per check. Tokens past the stop are trimmed, so the
            output is the same as checking every step.
        mode: the `torch.compile` mode of the decode step; None = "reduce-overhead" (CUDA
            graphs) on CUDA, the default mode elsewhere.
        backend: the `torch.compile` backend ("inductor" generates kernels; "eager" or
            "aot_eager" only trace, which is quick to compile and useful to test hooks).
    """

    stop_check_interval: int = 8
    mode: str | None = None
    backend: str | Callable = "inductor"

    def __post_init__(self):
        if self.stop_check_interval < 1:
            raise ValueError(f"stop_check_interval must be >= 1, got {self.stop_check_interval}")


# -- the protocol -----------------------------------------------------------------------------
def compile_safe(fn: Callable) -> Callable:
    """Mark a hook as declarative (tensor ops only, returns a new tensor or None, never edits in place)."""
    fn.compile_safe = True
    return fn


def is_compile_safe(fn: Callable) -> bool:
    """Whether a hook may run inside a compiled decode step: an `nn.Module`, or marked `compile_safe`
    (the interventions of `hooked.analysis.interventions` are); `at_steps(fn, ...)` is as safe as `fn`."""
    if getattr(fn, "compile_safe", False):
        return True
    if isinstance(fn, AtSteps):
        return is_compile_safe(fn.fn)
    return isinstance(fn, nn.Module)


def hook_label(fn: Callable) -> str:
    return getattr(fn, "__name__", None) or type(fn).__name__


class AddVector(nn.Module):
    """A steering hook: `activation + coefficient * vector` at every position (a declarative intervention).

    `vector` is `[d]` for an activation `[..., d]`; it runs inside a compiled decode step.
    """

    vector: torch.Tensor  # a buffer: follows the model's .to()

    def __init__(self, vector: Float[torch.Tensor, "d"], coefficient: float = 1.0):
        super().__init__()
        self.register_buffer("vector", vector.detach().clone())
        self.coefficient = coefficient

    def forward(self, activation: torch.Tensor, *, hook=None) -> torch.Tensor:
        return activation + self.coefficient * self.vector.to(activation.dtype)


class DeviceStepGate:
    """`at_steps(fn, steps)` for the static path: `fn`'s output where the step is chosen, else the input.

    The step is `forward_state.step_index`, a device tensor, and the choice a lookup in a
    `[max_steps]` bool table, so no Python branch depends on the step.
    """

    compile_safe = True

    def __init__(self, at: AtSteps, model, n_steps: int, device):
        self.at, self.model = at, model
        chosen = [at.selects(step) for step in range(n_steps)]
        self.active = torch.tensor(chosen, dtype=torch.bool, device=device)  # [n_steps]
        self.__name__ = at.__name__

    def __call__(self, activation: torch.Tensor, *, hook) -> torch.Tensor:
        out = self.at.fn(activation, hook=hook)
        out = activation if out is None else out
        step = self.model.forward_state.step_index.reshape(
            1
        )  # [1]: indexing with a 0-d tensor would read it on the host
        return torch.where(self.active.index_select(0, step), out, activation)

    def record_ran(self, n_steps_run: int) -> None:
        """Tell the wrapped `AtSteps` which of its steps ran (for its end-of-call check)."""
        self.at.ran = {step for step in range(n_steps_run) if self.at.selects(step)}


# -- recording activations into preallocated buffers --------------------------------------------
class StaticRecorder:
    """Caching hooks that write each forward's activations into `[..., capacity, ...]` buffers.

    Per-position activations are written at the forward's key columns along their position
    axis; attention scores and patterns `[batch, head, query, capacity]` as rows of a
    `[batch, head, capacity, capacity]` square. Buffers are made at the prefill (eagerly);
    every write is an `index_copy_`, so the hooks are traced into a compiled decode step.
    """

    compile_safe = True

    def __init__(self, model, names: list[str], capacity: int, device):
        self.model, self.names, self.capacity, self.device = model, names, capacity, device
        self.pos_axis = {name: model.hook_dict[name].pos_axis for name in names}
        self.buffers: dict[str, torch.Tensor] = {}

    def hooks(self) -> list[tuple[str, Callable]]:
        return [(name, self._saver(name)) for name in self.names]

    def _saver(self, name: str) -> Callable:
        def save(tensor: torch.Tensor, *, hook) -> None:
            self._write(name, tensor.detach())

        save.reads_only = save.compile_safe = True
        return save

    def _write(self, name: str, tensor: torch.Tensor) -> None:
        columns = self.model.forward_state.query_columns  # [n_new]
        axis = self.pos_axis[name]
        if name not in self.buffers:
            self.buffers[name] = self._allocate(name, tensor, axis, columns.shape[0])
        buffer = self.buffers[name]
        buffer.index_copy_(axis, columns.to(buffer.device), tensor.to(buffer.device))

    def _allocate(self, name: str, tensor: torch.Tensor, axis: int | None, n_new: int) -> torch.Tensor:
        if axis is None or tensor.shape[axis] != n_new:
            raise ValueError(
                f"return_cache with cache_implementation='static' records activations with one entry per fed "
                f"position; {name!r} has shape {tuple(tensor.shape)}. Leave it out of names_filter, or use the "
                "default cache."
            )
        shape = list(tensor.shape)
        shape[axis] = self.capacity
        fill = float("-inf") if name.endswith(("hook_attn_scores", "indexer.hook_scores")) else 0.0
        device = tensor.device if self.device is None else self.device
        return torch.full(shape, fill, dtype=tensor.dtype, device=device)

    def assemble(self, n_fed: int) -> dict[str, torch.Tensor]:
        """Every buffer cut to the `n_fed` positions that were fed (attention: `[..., n_fed, n_fed]`)."""
        out = {}
        for name, buffer in self.buffers.items():
            cut = buffer.narrow(self.pos_axis[name], 0, n_fed)
            if name.endswith(("hook_attn_scores", "hook_pattern", "indexer.hook_scores")):
                cut = cut[..., :n_fed]  # [batch, head, n_fed, n_fed] (DSA's indexer scores: [batch, n_fed, n_fed])
            out[name] = cut.clone()
        return out


# -- the compiled decode step -----------------------------------------------------------------
def _decode_step(model, newest: torch.Tensor, cache) -> Float[torch.Tensor, "batch d_vocab"]:
    """Last-position logits of one decode step: one token per row, written at the cache's next column."""
    return model(newest, past_kv_cache=cache, logits_to_keep=1)[:, -1]


_COMPILED: dict[tuple[str, str | Callable], Callable] = {}


def decode_step(cache, compile: bool, options: StaticCacheOptions) -> Callable:
    """The decode step: `_decode_step`, compiled once per mode and backend (calls of the same shapes reuse it)."""
    if not compile:
        return _decode_step
    device = cache.mask.device
    mode = options.mode or ("reduce-overhead" if device.type == "cuda" else "default")
    key = (mode, options.backend)
    if key not in _COMPILED:
        mode_arg = mode if options.backend == "inductor" else None  # modes are inductor's
        _COMPILED[key] = torch.compile(_decode_step, mode=mode_arg, backend=options.backend, dynamic=False)
    compiled = _COMPILED[key]
    if device.type != "cuda" or mode != "reduce-overhead":
        return compiled
    for tensor in cache.tensors():  # CUDA graphs replay fixed addresses: the cache must never move
        torch._dynamo.mark_static_address(tensor)

    def step(model, newest, cache):
        torch.compiler.cudagraph_mark_step_begin()
        return compiled(model, newest, cache).clone()  # a replay overwrites its outputs

    return step


def warn_python_hooks(unsafe: list[tuple[str, Callable]]) -> None:
    """One warning naming the hooks that keep the decode steps eager."""
    listed = ", ".join(f"{hook_label(fn)!r} on {name!r}" for name, fn in unsafe[:5])
    more = f" and {len(unsafe) - 5} more" if len(unsafe) > 5 else ""
    warnings.warn(
        f"generate(cache_implementation='static', compile=True): hook {listed}{more} is a Python function that "
        "torch.compile may not trace, so the decode steps run eagerly (not compiled). To run it compiled, make "
        "it declarative (tensor ops only, return a new tensor, no in-place edit) and mark it with "
        "hooked.generation.static_cache.compile_safe, or write it as a torch.nn.Module.",
        stacklevel=4,
    )
