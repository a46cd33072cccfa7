"""Fast `self.W_Q`-style access to registered parameters, buffers and submodules.

`nn.Module` keeps parameters, buffers and submodules in per-instance dicts
(`_parameters`, `_buffers`, `_modules`), not in the instance `__dict__`. So every
`self.W_Q` or `self.hook_q` first fails Python's normal attribute lookup, raises and
catches an `AttributeError`, and only then runs `nn.Module.__getattr__`: close to a
microsecond each, about forty times per layer on every decoding step, which is a few
percent of a small model's generation time on CPU.

`install_fast_attributes(model)` puts a small descriptor on the class for each
registered name. Normal lookup finds it and it reads the same dicts directly, so an
attribute behaves exactly as before (assignment, `del`, `hasattr`, the error for a
missing name) and only gets cheaper. It touches only classes defined in this project
(the `hooked` package), never a user's own module classes.
"""

from __future__ import annotations

import torch.nn as nn

OWN_PACKAGES = ("hooked",)  # components/ and loading/ install as hooked.components, hooked.loading


class RegisteredAttribute:
    """Class-level lookup of `name` in an instance's `_parameters`, `_modules`, `_buffers`.

    A non-data descriptor: `nn.Module.__setattr__` still handles assignment (it never
    stores these names in the instance `__dict__`), and a name the instance has not
    registered falls back to `nn.Module.__getattr__`, which raises the usual error.
    """

    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def __get__(self, obj, objtype=None):
        if obj is None:
            return self
        state = obj.__dict__
        for store in ("_parameters", "_modules", "_buffers"):
            registered = state[store]
            if self.name in registered:
                return registered[self.name]
        return nn.Module.__getattr__(obj, self.name)


def install_fast_attributes(root: nn.Module) -> None:
    """Give every project-defined module class under `root` a descriptor per registered name.

    Names that already exist on the class (a property such as grouped-query attention's
    `W_K`, a method) are left alone. Installing twice is a no-op.
    """
    for module in root.modules():
        cls = type(module)
        if cls.__module__.split(".")[0] not in OWN_PACKAGES:
            continue
        for name in (*module._parameters, *module._modules, *module._buffers):
            if not hasattr(cls, name):
                setattr(cls, name, RegisteredAttribute(name))
