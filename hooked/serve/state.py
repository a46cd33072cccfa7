"""The options and the state of one `hooked serve` application.

`ServeOptions` is what `hooked serve` configures besides the model and the tokens;
`ServeState` is what the endpoints read from `request.app.state.serve`. They live apart from
`create_app` (hooked/serve/app.py), which builds them, so the endpoints read the state without
importing the application that wires them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hooked.serve import ops, wire
from hooked.serve.auth import Auth
from hooked.serve.connections import ConnectionLimits
from hooked.serve.scheduler import Scheduler, SchedulerOptions


@dataclass
class ServeOptions:
    """Everything `hooked serve` configures besides the model and the tokens."""

    scheduler: SchedulerOptions = field(default_factory=SchedulerOptions)
    limits: ops.ServeLimits = field(default_factory=ops.ServeLimits)
    wire: wire.Limits = field(default_factory=wire.Limits)
    connections: ConnectionLimits = field(default_factory=ConnectionLimits)
    drain_timeout_s: float = 30.0


@dataclass
class ServeState:
    """What the endpoints read (`request.app.state.serve`): the model, its limits, the scheduler, auth."""

    model: Any
    ctx: ops.Context
    scheduler: Scheduler
    auth: Auth
    options: ServeOptions
    info: dict
    relay: Any = None


__all__ = ["ServeOptions", "ServeState"]
