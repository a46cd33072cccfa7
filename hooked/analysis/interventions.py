"""Declarative interventions: hook functions that are also data.

An intervention is an ordinary hook (`fn(activation, hook)`, usable in `fwd_hooks=[(name, fn)]`)
described entirely by a few numbers and tensors, so it can be sent to a server and rebuilt
there without running any code the sender wrote (`to_spec` / `from_spec`). Each one computes
a replacement value from the activation (zeros, a mean, another row, a steering vector, ...)
and writes it only where its selection applies:

    positions   indices on the activation's position axis (negative counts from the end; at a
                KV-cached generation step the activation holds only the newest position: -1)
    heads       indices on the head axis of per-head activations (q/k/v/z/result, pattern, scores)
    rows        batch rows
    steps       generation steps (`model.forward_state.step`: 0 = prompt, t = t-th new token)

Selections are boolean masks built from the activation's shape and applied with `torch.where`,
so no Python branch depends on a tensor's values and the hooks trace under `torch.compile`: every
intervention is marked `compile_safe`, so `generate(..., cache_implementation="static", compile=True)`
runs it inside the compiled decode step (and `steps=` becomes a device-side gate there).
`chain(a, b, ...)` (or `a.then(b)`) applies interventions in order at one hook point.

    from hooked.analysis import interventions as iv
    logits = model.run_with_hooks(tokens, fwd_hooks=[
        ("blocks.0.attn.hook_z", iv.zero_ablate(heads=[1, 3])),
        ("blocks.1.hook_resid_post", iv.add(steering, scale=4.0, positions=[-1])),
    ])
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any, Literal, cast, overload

import torch
from jaxtyping import Float

from hooked.core.errors import InputError
from hooked.core.utils import AtSteps

#: Hook-name endings of `[batch, pos, head, d_head]` activations (head axis 2).
PER_HEAD_VECTOR = ("hook_q", "hook_k", "hook_v", "hook_z", "hook_result", "hook_rot_q", "hook_rot_k")
#: Hook-name endings of `[batch, head, dest, src]` activations (head axis 1).
PER_HEAD_PATTERN = ("hook_pattern", "hook_attn_scores")
#: Most indices one selection may list, and most entries in a chain (keeps a request's spec small).
MAX_INDICES = 4096
MAX_CHAIN = 64

Activation = Float[torch.Tensor, "batch ..."]


def _indices(value, what: str) -> tuple[int, ...] | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, list, tuple, range)):
        raise InputError(f"{what} must be None, an int or a list of ints, got {type(value).__name__}")
    items = [value] if isinstance(value, int) else list(value)
    if len(items) > MAX_INDICES or not all(isinstance(i, int) and not isinstance(i, bool) for i in items):
        raise InputError(f"{what} must be a list of at most {MAX_INDICES} ints, got {value!r:.80}")
    return tuple(items)


def _axis_mask(n: int, chosen: tuple[int, ...] | None, device, what: str) -> torch.Tensor | None:
    """`[n]` bool, True at `chosen` (negative indices count from the end); None selects all."""
    if chosen is None:
        return None
    bad = [i for i in chosen if not -n <= i < n]
    if bad:
        raise InputError(f"{what} {bad} out of range for an axis of length {n}")
    mask = torch.zeros(n, dtype=torch.bool, device=device)
    mask[[i % n for i in chosen]] = True
    return mask


def head_axis(name: str) -> int | None:
    """The head axis of hook point `name`'s activation (with batch), or None if it has none."""
    if name.endswith(PER_HEAD_VECTOR):
        return 2
    if name.endswith(PER_HEAD_PATTERN):
        return 1
    return None


class Intervention(AtSteps):
    """Base class: a hook writing `replacement(activation)` where the selection applies.

    Subclasses set `op` (their name in specs) and `params` (JSON fields) and implement
    `replacement`; tensors they hold are listed in `tensors`.
    """

    op = ""
    params: tuple[str, ...] = ()
    tensors: tuple[str, ...] = ()
    #: tensor ops only, shapes read from the activation, a new tensor returned: traced whole by
    #: `torch.compile` (`hooked.generation.static_cache.is_compile_safe` reads this)
    compile_safe = True

    def __init__(self, positions=None, heads=None, rows=None, steps=None):
        self.positions = _indices(positions, "positions")
        self.heads = _indices(heads, "heads")
        self.rows = _indices(rows, "rows")
        self.step_list = _indices(steps, "steps")
        super().__init__(self._apply, self.step_list if self.step_list is not None else slice(0, None))
        self.__name__ = type(self).__name__

    def replacement(self, act: Activation, hook) -> Activation:
        raise NotImplementedError

    def check(self) -> None:
        if self.step_list is not None:  # without steps every call applies: nothing to check
            super().check()

    def then(self, other: Intervention) -> Chain:
        """This intervention, then `other`, at the same hook point."""
        return chain(self, other)

    def __call__(self, act: Activation, hook) -> Activation | None:
        if self.step_list is None:
            return self._apply(act, hook=hook)
        return super().__call__(act, hook=hook)

    def _apply(self, act: Activation, *, hook) -> Activation:
        new = self.replacement(act, hook).to(act.dtype)
        mask = self.mask(act, getattr(hook, "name", "") or "", getattr(hook, "pos_axis", 1))
        if mask is None:
            return new.expand_as(act).clone()
        return torch.where(mask, new, act)

    def mask(self, act: Activation, name: str, pos_axis: int | None) -> torch.Tensor | None:
        """A bool tensor broadcasting to `act` (True = write), or None for everywhere."""
        axes: list[tuple[int, tuple[int, ...] | None, str]] = [(0, self.rows, "rows")]
        if self.positions is not None:
            if pos_axis is None:
                raise InputError(f"positions= on {name!r}, which has no position axis: drop positions")
            axes.append((pos_axis, self.positions, "positions"))
        if self.heads is not None:
            axis = head_axis(name)
            if axis is None:
                raise InputError(
                    f"heads= on {name!r}, which has no head axis: use hook_z/hook_q/hook_k/hook_v/hook_result "
                    "or hook_pattern/hook_attn_scores"
                )
            axes.append((axis, self.heads, "heads"))
        mask = None
        for axis, chosen, what in axes:
            m = _axis_mask(act.shape[axis], chosen, act.device, f"{what} of {name!r}")
            if m is None:
                continue
            shape = [1] * act.ndim
            shape[axis] = act.shape[axis]
            m = m.reshape(shape)  # [1, ..., n, ..., 1]
            mask = m if mask is None else mask & m
        return mask

    # -- data form ------------------------------------------------------------------------
    def to_spec(self, prefix: str = "t") -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
        """(JSON-able dict, tensors by name): everything `from_spec` needs to rebuild this."""
        spec: dict[str, Any] = {"op": self.op}
        for key, value in (("positions", self.positions), ("heads", self.heads), ("rows", self.rows)):
            if value is not None:
                spec[key] = list(value)
        if self.step_list is not None:
            spec["steps"] = list(self.step_list)
        for key in self.params:
            spec[key] = getattr(self, key)
        tensors = {}
        for i, key in enumerate(self.tensors):
            value = getattr(self, key)
            if value is not None:
                tensors[f"{prefix}.{i}"] = value.detach().cpu().contiguous()
                spec[key] = f"{prefix}.{i}"
        return spec, tensors

    def __repr__(self) -> str:
        spec, _ = self.to_spec()
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in spec.items() if k != 'op')})"


# -- the operations ---------------------------------------------------------------------------
class ZeroAblate(Intervention):
    """Replace the selection with zeros."""

    op = "zero_ablate"

    def replacement(self, act, hook):
        return torch.zeros_like(act)


class MeanAblate(Intervention):
    """Replace the selection with a mean: `mean` (broadcasting to the activation, e.g. over a
    reference dataset) or, when None, the mean over the batch's rows."""

    op = "mean_ablate"
    tensors = ("mean",)

    def __init__(self, mean: torch.Tensor | None = None, **select):
        super().__init__(**select)
        self.mean = _tensor_or_none(mean, "mean")

    def replacement(self, act, hook):
        return act.mean(0, keepdim=True) if self.mean is None else self.mean.to(act.device, act.dtype)


class ResampleAblate(Intervention):
    """Replace each row with another row of the batch: row i takes row `source_rows[i]`
    (default: row i - 1, cyclically), e.g. the activation of an unrelated prompt."""

    op = "resample_ablate"
    params = ("source_rows",)

    def __init__(self, source_rows: Sequence[int] | None = None, **select):
        super().__init__(**select)
        indices = _indices(source_rows, "source_rows")
        self.source_rows = None if indices is None else list(indices)

    def replacement(self, act, hook):
        if self.source_rows is None:
            return act.roll(1, dims=0)
        if len(self.source_rows) != act.shape[0]:
            raise InputError(f"source_rows has {len(self.source_rows)} entries for a batch of {act.shape[0]} rows")
        index = torch.tensor([i % act.shape[0] for i in self.source_rows], device=act.device)
        return act.index_select(0, index)


class PatchPrompt(Intervention):
    """Cross-prompt patching: every selected row takes row `source` of the same batch
    (e.g. the clean prompt's activation written into the corrupted prompts)."""

    op = "patch_prompt"
    params = ("source",)

    def __init__(self, source: int = 0, **select):
        super().__init__(**select)
        if isinstance(source, bool) or not isinstance(source, int):
            raise InputError(f"source must be a batch row (int), got {source!r}")
        self.source = source

    def replacement(self, act, hook):
        return act.narrow(0, self.source % act.shape[0], 1)


class SetTo(Intervention):
    """Replace the selection with `tensor` (broadcasting to the activation)."""

    op = "set"
    tensors = ("tensor",)

    def __init__(self, tensor: torch.Tensor, **select):
        super().__init__(**select)
        self.tensor = _tensor_or_none(tensor, "tensor", required=True)

    def replacement(self, act, hook):
        return self.tensor.to(act.device, act.dtype).expand_as(act)


class PatchCache(SetTo):
    """Replace the selection with a cached activation of the same hook point (`cache[name]`,
    the activation's full shape): activation patching from another run."""

    op = "patch_cache"

    def replacement(self, act, hook):
        if self.tensor.shape != act.shape:
            raise InputError(
                f"the cached activation is {tuple(self.tensor.shape)} but {getattr(hook, 'name', 'the hook')!r} is "
                f"{tuple(act.shape)}: cache it from inputs of the same batch size and length"
            )
        return self.tensor.to(act.device, act.dtype)


class Add(Intervention):
    """Add `scale * tensor` (e.g. a steering vector `[d_model]`) to the selection."""

    op = "add"
    params = ("scale",)
    tensors = ("tensor",)

    def __init__(self, tensor: torch.Tensor, scale: float = 1.0, **select):
        super().__init__(**select)
        self.tensor = _tensor_or_none(tensor, "tensor", required=True)
        self.scale = _number(scale, "scale")

    def replacement(self, act, hook):
        return act + self.scale * self.tensor.to(act.device, act.dtype)


class Scale(Intervention):
    """Multiply the selection by `factor`."""

    op = "scale"
    params = ("factor",)

    def __init__(self, factor: float, **select):
        super().__init__(**select)
        self.factor = _number(factor, "factor")

    def replacement(self, act, hook):
        return act * self.factor


class Clamp(Intervention):
    """Clamp the selection into `[min, max]` (either may be None)."""

    op = "clamp"
    params = ("min", "max")

    def __init__(self, min: float | None = None, max: float | None = None, **select):
        super().__init__(**select)
        self.min = None if min is None else _number(min, "min")
        self.max = None if max is None else _number(max, "max")
        if self.min is None and self.max is None:
            raise InputError("clamp needs min or max")

    def replacement(self, act, hook):
        return act.clamp(min=self.min, max=self.max)


class ProjectOut(Intervention):
    """Remove the component along `direction` (last axis): `x - (x . d) d` with `d` normalised."""

    op = "project_out"
    tensors = ("direction",)

    def __init__(self, direction: torch.Tensor, **select):
        super().__init__(**select)
        self.direction = _tensor_or_none(direction, "direction", required=True)
        if self.direction.ndim != 1:
            raise InputError(f"direction must be a vector [d], got shape {tuple(self.direction.shape)}")

    def replacement(self, act, hook):
        d = self.direction.to(act.device, torch.float32)
        d = d / d.norm().clamp_min(1e-12)
        x = act.float()
        return (x - (x @ d)[..., None] * d).to(act.dtype)  # [..., d] - [..., 1] * [d]


class Chain(AtSteps):
    """Several interventions applied in order at one hook point (each with its own selection)."""

    op = "chain"

    @property
    def compile_safe(self) -> bool:
        """Traced whole unless an item has `steps=`: an item's own step check reads the step on the host."""
        return all(item.step_list is None for item in self.items)

    def __init__(self, items: Sequence[Intervention]):
        items = list(items)
        if not items or len(items) > MAX_CHAIN or not all(isinstance(i, Intervention) for i in items):
            raise InputError(f"chain takes 1 to {MAX_CHAIN} interventions, got {items!r:.120}")
        self.items = items
        super().__init__(self._apply, slice(0, None))
        self.__name__ = "Chain"

    def __call__(self, act, hook):
        return self._apply(act, hook=hook)

    def _apply(self, act, *, hook):
        for item in self.items:
            if item.step_list is not None:
                item.model = self.model
            out = item(act, hook)
            act = act if out is None else out
        return act

    def reset(self) -> None:
        for item in self.items:
            item.reset()

    def check(self) -> None:
        for item in self.items:
            item.check()

    def then(self, other: Intervention) -> Chain:
        return Chain([*self.items, *(other.items if isinstance(other, Chain) else [other])])

    def to_spec(self, prefix: str = "t") -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
        specs, tensors = [], {}
        for i, item in enumerate(self.items):
            spec, ts = item.to_spec(f"{prefix}.{i}")
            specs.append(spec)
            tensors.update(ts)
        return {"op": "chain", "items": specs}, tensors


@overload
def _tensor_or_none(value, what: str, required: Literal[True]) -> torch.Tensor: ...


@overload
def _tensor_or_none(value, what: str, required: bool = False) -> torch.Tensor | None: ...


def _tensor_or_none(value, what: str, required: bool = False) -> torch.Tensor | None:
    if value is None and not required:
        return None
    if not isinstance(value, torch.Tensor) or not value.is_floating_point():
        raise InputError(f"{what} must be a floating-point torch.Tensor, got {type(value).__name__}")
    return value.detach()


def _number(value, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InputError(f"{what} must be a finite number, got {value!r}")
    return float(value)


# -- constructors (the public names) ------------------------------------------------------------
def zero_ablate(heads=None, positions=None, rows=None, steps=None) -> ZeroAblate:
    """Zero the activation (at `heads`, `positions`, `rows`, `steps` if given)."""
    return ZeroAblate(positions=positions, heads=heads, rows=rows, steps=steps)


def mean_ablate(mean=None, heads=None, positions=None, rows=None, steps=None) -> MeanAblate:
    """Replace with `mean` (default: the batch mean)."""
    return MeanAblate(mean, positions=positions, heads=heads, rows=rows, steps=steps)


def resample_ablate(source_rows=None, heads=None, positions=None, rows=None, steps=None) -> ResampleAblate:
    """Replace row i with row `source_rows[i]` (default: the previous row)."""
    return ResampleAblate(source_rows, positions=positions, heads=heads, rows=rows, steps=steps)


def set_to(tensor, heads=None, positions=None, rows=None, steps=None) -> SetTo:
    """Replace with `tensor` (broadcasting)."""
    return SetTo(tensor, positions=positions, heads=heads, rows=rows, steps=steps)


def add(tensor, scale: float = 1.0, positions=None, heads=None, rows=None, steps=None) -> Add:
    """Add `scale * tensor` (a steering vector)."""
    return Add(tensor, scale, positions=positions, heads=heads, rows=rows, steps=steps)


def patch_cache(activation, heads=None, positions=None, rows=None, steps=None) -> PatchCache:
    """Write a cached activation (same shape) into the run."""
    return PatchCache(activation, positions=positions, heads=heads, rows=rows, steps=steps)


def patch_prompt(source: int = 0, heads=None, positions=None, rows=None, steps=None) -> PatchPrompt:
    """Write batch row `source`'s activation into the selected rows (cross-prompt patching)."""
    return PatchPrompt(source, positions=positions, heads=heads, rows=rows, steps=steps)


def scale(factor: float, heads=None, positions=None, rows=None, steps=None) -> Scale:
    """Multiply by `factor`."""
    return Scale(factor, positions=positions, heads=heads, rows=rows, steps=steps)


def clamp(min=None, max=None, heads=None, positions=None, rows=None, steps=None) -> Clamp:
    """Clamp into `[min, max]`."""
    return Clamp(min, max, positions=positions, heads=heads, rows=rows, steps=steps)


def project_out(direction, heads=None, positions=None, rows=None, steps=None) -> ProjectOut:
    """Remove the component along `direction`."""
    return ProjectOut(direction, positions=positions, heads=heads, rows=rows, steps=steps)


def chain(*items: Intervention) -> Chain:
    """Apply `items` in order at one hook point."""
    flat: list[Intervention] = []
    for item in items:
        flat.extend(item.items if isinstance(item, Chain) else [item])
    return Chain(flat)


#: op name -> class: the only classes `from_spec` builds (a spec names an op, never code).
OPS: dict[str, type[Intervention]] = {
    cls.op: cls
    for cls in (ZeroAblate, MeanAblate, ResampleAblate, PatchPrompt, SetTo, PatchCache, Add, Scale, Clamp, ProjectOut)
}
_SELECT = ("positions", "heads", "rows", "steps")


def from_spec(spec: dict, tensors: dict[str, torch.Tensor], depth: int = 0) -> Intervention | Chain:
    """Rebuild an intervention from `to_spec`'s output; anything unexpected raises `InputError`."""
    if not isinstance(spec, dict) or not isinstance(spec.get("op"), str):
        raise InputError(f"an intervention spec must be an object with an 'op' string, got {spec!r:.80}")
    op = spec["op"]
    if op == "chain":
        items = spec.get("items")
        if depth > 0 or not isinstance(items, list) or set(spec) != {"op", "items"}:
            raise InputError("a chain spec is {'op': 'chain', 'items': [...]} and cannot nest")
        # (a chain item is never a Chain: from_spec refuses a chain below depth 0)
        return Chain(cast("list[Intervention]", [from_spec(item, tensors, depth + 1) for item in items]))
    cls = OPS.get(op)
    if cls is None:
        raise InputError(f"unknown intervention op {op!r}; known: {sorted(OPS)} and 'chain'")
    allowed = {"op", *_SELECT, *cls.params, *cls.tensors}
    unknown = set(spec) - allowed
    if unknown:
        raise InputError(f"intervention {op!r} has no field(s) {sorted(unknown)}; fields: {sorted(allowed - {'op'})}")
    kwargs = {key: spec[key] for key in (*_SELECT, *cls.params) if key in spec}
    for key in cls.tensors:
        if key in spec:
            ref = spec[key]
            if not isinstance(ref, str) or ref not in tensors:
                raise InputError(f"intervention {op!r} field {key!r} names tensor {ref!r:.40}, which the request lacks")
            kwargs[key] = tensors[ref]
    try:
        return cls(**kwargs)
    except TypeError as e:
        raise InputError(f"intervention {op!r}: {e}") from None


def specs_of(fwd_hooks: Iterable[tuple[str, Any]]) -> tuple[list[dict], dict[str, torch.Tensor]]:
    """`[(name, intervention), ...]` as `[{"name": ..., "hook": spec}]` plus their tensors."""
    out, tensors = [], {}
    for i, pair in enumerate(fwd_hooks):
        name, fn = pair
        if not isinstance(name, str):
            raise InputError(f"remote hooks need a hook name (str), got {type(name).__name__} at fwd_hooks[{i}]")
        if not isinstance(fn, (Intervention, Chain)):
            raise InputError(
                f"remote fwd_hooks[{i}] ({name!r}) is {type(fn).__name__}, not a hooked.analysis.interventions "
                "object: a "
                "server runs only interventions (zero_ablate, add, patch_cache, ...), never Python functions"
            )
        spec, ts = fn.to_spec(f"h{i}")
        out.append({"name": name, "hook": spec})
        tensors.update(ts)
    return out, tensors


__all__ = [
    "Add",
    "Chain",
    "Clamp",
    "Intervention",
    "MeanAblate",
    "OPS",
    "PatchCache",
    "PatchPrompt",
    "ProjectOut",
    "ResampleAblate",
    "Scale",
    "SetTo",
    "ZeroAblate",
    "add",
    "chain",
    "clamp",
    "from_spec",
    "head_axis",
    "mean_ablate",
    "patch_cache",
    "patch_prompt",
    "project_out",
    "resample_ablate",
    "scale",
    "set_to",
    "specs_of",
    "zero_ablate",
]
