"""Seam: what an analysis method needs to know about a kind of model, registered by the room that defines it.

A method room (analysis, circuits) works on any hooked model through hook points; a few models
run part of a method differently (a served model computes a patching sweep on its server, a
pipelined model cannot restart its forward at a middle layer). Rather than ask which kind a
model is, a method keeps a `ModelKinds` registry keyed by class, and the room that defines the
model class (`hooked.remote`, `hooked.scale`) registers it there when it is imported.

    ACTIVATION_PATCH = ModelKinds[Callable]("computes generic_activation_patch itself")
    ACTIVATION_PATCH.register(RemoteModel, RemoteModel.remote_activation_patch)  # in hooked.remote
    fn = ACTIVATION_PATCH.lookup(model)  # the registered value of the model's class or a base, else None
"""

from __future__ import annotations

from typing import Generic, TypeVar

T = TypeVar("T")

__all__ = ["ModelKinds"]


class ModelKinds(Generic[T]):
    """A value per model class (and its subclasses): `register(cls, value)`, `lookup(model)`."""

    def __init__(self, meaning: str):
        self.meaning = meaning  # what a registered value says, for the repr
        self._by_class: dict[type, T] = {}

    def register(self, model_class: type, value: T) -> None:
        self._by_class[model_class] = value

    def lookup(self, model: object) -> T | None:
        """The value registered for `type(model)` or its nearest base class; None if none is."""
        for cls in type(model).__mro__:
            if cls in self._by_class:
                return self._by_class[cls]
        return None

    def __repr__(self) -> str:
        names = sorted(cls.__qualname__ for cls in self._by_class)
        return f"ModelKinds({self.meaning!r}: {', '.join(names) or 'none registered'})"
