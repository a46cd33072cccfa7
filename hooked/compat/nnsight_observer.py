"""nnsight's "may a tracer wait here" observer, registered with the core's `TRACE_OBSERVERS`.

nnsight (`NNsight(model)`, `hooked.compat.nnsight.HookedNNsight`) installs a per-instance `forward`
on every module, inert outside a trace. Inside one, each of its workers waits on one location at a
time, in execution order, so a hook point is watched when a worker waits on its input, skip or
output, a `tracer.cache()` keeps it, or a worker sits at a barrier (it may ask for anything once
released). This module imports no nnsight: it reads the state nnsight leaves on a module (duck-typed
against nnsight 0.8), and `hooked` imports it so a plain `NNsight(model)` is seen too.
"""

from __future__ import annotations

from typing import Any

import torch.nn as nn

from hooked.core.hook_points import register_trace_observer

NNSIGHT_STATE = "__nnsight__"  # where nnsight keeps a module's trace routes (nnsight.intervention.source.STATE)


def nnsight_waits_on(state: Any) -> bool:
    """Whether an nnsight trace running now may serve a worker at this module (`state`: its nnsight state)."""
    interleaver, _, locations = state.active()
    if interleaver is None:  # no trace running on this module: nnsight's forward is inert
        return False
    parked, observers = interleaver.parked, interleaver.observers
    if any(location in parked or location in observers for location in locations):
        return True
    # A worker at a barrier is released by another's visit and may then ask for anything.
    return any(m.pending is not None and m.pending.provider is None for m in interleaver.mediators)


def traced_by_nnsight(module: nn.Module) -> bool:
    """True while an nnsight trace may read, edit or take the gradient of `module`'s activation."""
    state = module.__dict__.get(NNSIGHT_STATE)
    return state is not None and nnsight_waits_on(state)


register_trace_observer(traced_by_nnsight)
