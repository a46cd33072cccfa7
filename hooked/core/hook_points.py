"""Hook machinery: identity modules that user functions can read and rewrite.

Every activation of a `HookedTransformer` passes through a `HookPoint`. A hook is a
function `fn(tensor, *, hook: HookPoint) -> Tensor | None`: returning a tensor replaces
the activation downstream, returning `None` keeps it (in-place edits included).
`HookedRootModule` finds the hook points by name and adds, nests and removes hooks.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import logging
import re
import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, cast

import torch
import torch.nn as nn
from torch.utils.hooks import RemovableHandle

from hooked.core.errors import HookNotEnabledError, HookShapeError, InputError  # noqa: F401  (re-exported)
from hooked.core.fast_attributes import install_fast_attributes
from hooked.core.thread_guard import exclusive
from hooked.core.validation import check_hook_fn, check_hook_pairs, check_names_filter, check_pos_slice

logger = logging.getLogger(__name__)

HookFunction = Callable[..., torch.Tensor | None]
NameFilter = str | Sequence[str] | Callable[[str], bool] | None
Direction = Literal["fwd", "bwd", "both"]


@dataclass
class LensHandle:
    """A hook that is attached to a HookPoint, with what is needed to remove it later."""

    hook: RemovableHandle
    is_permanent: bool = False
    context_level: int | None = None


TraceObserver = Callable[[nn.Module], bool]
"""Answers whether an external tracing library may wait on a module's activation right now."""

TRACE_OBSERVERS: list[TraceObserver] = []
"""The "may a tracer wait here" callbacks: a compatibility module registers its library's (see
`register_trace_observer`), so the core never names one. Empty unless such a module was imported."""


def register_trace_observer(observer: TraceObserver) -> None:
    """Add `observer` to the callbacks `HookPoint.traced_externally` asks (once per observer)."""
    if observer not in TRACE_OBSERVERS:
        TRACE_OBSERVERS.append(observer)


def _mark_hook_error(error: Exception, fn: HookFunction, name: str | None) -> None:
    """Record on an exception the innermost hook it came from (`hook_fn_name`, `hook_point_name`)."""
    if getattr(error, "hook_point_name", None) is not None:
        return
    fn_name = getattr(fn, "__name__", None) or getattr(getattr(fn, "func", None), "__name__", None) or repr(fn)
    with contextlib.suppress(AttributeError):  # an exception class with __slots__ keeps no attributes
        # tags any exception type with where it happened (read by the errors that report it)
        error.hook_point_name, error.hook_fn_name = name, fn_name  # pyright: ignore[reportAttributeAccessIssue]


class _HookHandle(RemovableHandle):
    """A removable hook whose key is the next free slot of its hook point, not a global counter.

    Adding and removing the same hooks again gives the same keys, so a compiled model's
    guards on the hook dict (it guards the keys) match again instead of recompiling on
    every `run_with_hooks` call. `remove` deletes only its own hook, never a later one that
    reuses the slot.
    """

    def __init__(self, fns: OrderedDict, hook: HookFunction):
        super().__init__(fns)
        self.id = max(fns, default=0) + 1  # from 1, as TransformerLens's handle ids
        self.fn = hook

    def remove(self) -> None:
        fns = self.hooks_dict_ref()
        if fns is not None and self.id in fns and fns[self.id] is self.fn:
            del fns[self.id]


class HookPoint(nn.Module):
    """An identity module marking one activation, where hooks can read or replace it.

    Arguments:
        pos_axis: which axis of the activation (with its batch axis) counts positions,
            used by `pos_slice`; `None` means the activation has no position axis.
        requires: the config flag that must be on for this optional hook to fire.
    """

    def __init__(self, pos_axis: int | None = 1, requires: str | None = None):
        super().__init__()
        self.name: str | None = None
        self.ctx: dict[Any, Any] = {}
        self.pos_axis = pos_axis
        self.requires = requires
        self.fwd_hooks: list[LensHandle] = []
        self.bwd_hooks: list[LensHandle] = []
        # OrderedDicts: RemovableHandle keeps a weak reference to the dict it removes from.
        self._fwd_fns: OrderedDict[int, HookFunction] = OrderedDict()
        self._bwd_fns: OrderedDict[int, HookFunction] = OrderedDict()
        self._warned_cast = False
        # Which forward call a gradient belongs to: a pipeline's micro-batch slices pass through
        # a hook point in order, but autograd returns their gradients in no fixed order.
        self.n_forward_calls = 0
        self.grad_forward_call: int | None = None

    # -- adding and removing -------------------------------------------------------
    def add_hook(
        self,
        hook: HookFunction,
        dir: Literal["fwd", "bwd"] = "fwd",
        is_permanent: bool = False,
        level: int | None = None,
        prepend: bool = False,
    ) -> LensHandle:
        """Attach `hook`; `prepend=True` runs it before the hooks already here."""
        if dir not in ("fwd", "bwd"):
            raise ValueError(f"dir must be 'fwd' or 'bwd', got {dir!r}")
        check_hook_fn(hook, repr(self.name))
        fns, handles = (self._fwd_fns, self.fwd_hooks) if dir == "fwd" else (self._bwd_fns, self.bwd_hooks)
        handle = _HookHandle(fns, hook)
        fns[handle.id] = hook
        lens = LensHandle(handle, is_permanent, level)
        if prepend:
            fns.move_to_end(handle.id, last=False)
            handles.insert(0, lens)
        else:
            handles.append(lens)
        return lens

    def add_perma_hook(self, hook: HookFunction, dir: Literal["fwd", "bwd"] = "fwd") -> LensHandle:
        return self.add_hook(hook, dir=dir, is_permanent=True)

    def remove_hooks(self, dir: Direction = "fwd", including_permanent: bool = False, level: int | None = None) -> None:
        """Remove non-permanent hooks (all hooks with `including_permanent`), only at `level` if given."""
        if dir not in ("fwd", "bwd", "both"):
            raise ValueError(f"dir must be 'fwd', 'bwd' or 'both', got {dir!r}")
        for d in ("fwd", "bwd"):
            if dir not in (d, "both"):
                continue
            handles = self.fwd_hooks if d == "fwd" else self.bwd_hooks
            keep = []
            for lens in handles:
                removable = (including_permanent or not lens.is_permanent) and (
                    level is None or lens.context_level == level
                )
                if removable:
                    lens.hook.remove()
                else:
                    keep.append(lens)
            handles[:] = keep

    def has_hooks(self, dir: Direction = "both", including_permanent: bool = True, level: int | None = None) -> bool:
        handles = {"fwd": self.fwd_hooks, "bwd": self.bwd_hooks, "both": self.fwd_hooks + self.bwd_hooks}[dir]
        return any(
            (including_permanent or not h.is_permanent) and (level is None or h.context_level == level) for h in handles
        )

    def clear_context(self) -> None:
        self.ctx = {}

    def layer(self) -> int:
        """The block index of a `blocks.{l}.…` hook point."""
        parts = (self.name or "").split(".")
        if len(parts) < 2 or parts[0] != "blocks" or not parts[1].isdigit():
            raise ValueError(f"Hook point {self.name!r} is not inside a block (expected 'blocks.<layer>.…')")
        return int(parts[1])

    # -- running -------------------------------------------------------------------
    @property
    def observed(self) -> bool:
        """True if calling this hook point can do anything: a hook of any kind is attached, or nnsight waits on it."""
        # len(), not truth: torch.compile guards a dict's length, not its truth (see __call__)
        hooks = len(self._fwd_fns) + len(self._bwd_fns) + len(self._forward_hooks) + len(self._forward_pre_hooks)
        return hooks > 0 or self.traced_externally

    @property
    def traced_externally(self) -> bool:
        """True while an external tracer (one of `TRACE_OBSERVERS`) may read, edit or take the gradient
        of this activation. Such a tracer counts as an editing hook: the path that computes the
        activation runs, as for `run_with_hooks`."""
        return len(TRACE_OBSERVERS) > 0 and any(observer(self) for observer in TRACE_OBSERVERS)

    @property
    def needs_grad_path(self) -> bool:
        """True if gradients must flow through this hook point's output: a backward hook is attached,
        or nnsight watches it while autograd records (its `.grad` reads the output's gradient)."""
        return len(self._bwd_fns) > 0 or (torch.is_grad_enabled() and self.traced_externally)

    @property
    def is_read_only(self) -> bool:
        """True if no attached hook can change the activation or needs its gradient (e.g. only caching hooks).

        A hook function declares itself read-only with a true `reads_only` attribute, as
        `run_with_cache`'s savers do; any other hook, a backward hook or a torch module hook
        makes this False, and so does an nnsight trace waiting on it (an nnsight read may be an edit).
        """
        if len(self._bwd_fns) + len(self._forward_hooks) + len(self._forward_pre_hooks) > 0 or self.traced_externally:
            return False
        return all(getattr(fn, "reads_only", False) for fn in self._fwd_fns.values())

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        # Bypasses nn.Module.__call__: an unhooked HookPoint costs a few dict checks.
        # Every test is an explicit len(): torch.compile (2.13) guards a dict's length when it is
        # read by len(), but not when the dict is tested for truth, so a hook added after
        # compiling would be silently skipped.
        if len(self._forward_hooks) + len(self._forward_pre_hooks) > 0:
            return super().__call__(x)
        forward = self.__dict__.get("forward")
        if forward is not None:  # a per-instance forward (nnsight's controller) sees every call
            return forward(x)
        if len(self._fwd_fns) + len(self._bwd_fns) == 0:
            return x
        return self.forward(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if len(self._fwd_fns) > 0:
            for fn in list(self._fwd_fns.values()):
                try:
                    out = fn(x, hook=self)
                except Exception as e:
                    _mark_hook_error(e, fn, self.name)
                    raise
                if out is not None:
                    x = self._check_replacement(out, x, fn)
        if len(self._bwd_fns) > 0 and x.requires_grad:
            # The backward hooks of this forward are the ones attached now, as in TransformerLens (a
            # module backward hook is bound at forward time): a backward run after the `hooks()`
            # context closed (circuit-tracer's attribution) still reaches them.
            fns = tuple(self._bwd_fns.values())
            x.register_hook(functools.partial(self._run_bwd_hooks, forward_call=self.n_forward_calls, fns=fns))
            self.n_forward_calls += 1
        return x

    def _run_bwd_hooks(self, grad: torch.Tensor, forward_call: int = 0, fns: tuple = ()) -> torch.Tensor:
        self.grad_forward_call = forward_call
        for fn in fns:
            out = fn(grad, hook=self)
            if out is not None:
                grad = self._check_replacement(out, grad, fn)
        return grad

    def _check_replacement(self, out: Any, x: torch.Tensor, fn: HookFunction) -> torch.Tensor:
        if not isinstance(out, torch.Tensor):
            raise TypeError(
                f"Hook {getattr(fn, '__name__', fn)!r} on {self.name!r} returned {type(out).__name__}; "
                "a hook must return a tensor or None."
            )
        if out.shape != x.shape:
            raise HookShapeError(
                f"Hook {getattr(fn, '__name__', fn)!r} on {self.name!r} returned shape {tuple(out.shape)}, "
                f"but the activation has shape {tuple(x.shape)}. Return a tensor of the same shape, or None "
                "after editing the activation in place."
            )
        if out.dtype == x.dtype and out.device != x.device:  # a split model: patches move to the layer's device
            return out.to(x.device)
        if out.dtype != x.dtype or out.device != x.device:
            if not self._warned_cast:
                warnings.warn(
                    f"Hook on {self.name!r} returned {out.dtype} on {out.device}; casting back to "
                    f"{x.dtype} on {x.device}.",
                    stacklevel=3,
                )
                self._warned_cast = True
            out = out.to(device=x.device, dtype=x.dtype)
        return out

    def extra_repr(self) -> str:
        return f"name={self.name!r}"


_LAYER = re.compile(r"^blocks\.(\d+)\.")


def close_hook_names(name: str, names: Sequence[str], n: int = 4) -> list[str]:
    """Up to `n` hook names like `name`, those of `name`'s own layer first (then by similarity).

    Without the layer rule, `blocks.0.attn.hook_patern` would list `blocks.20.attn.hook_pattern`
    next to `blocks.0.attn.hook_pattern`: difflib scores them almost alike.
    """
    layer = _LAYER.match(name)
    close = difflib.get_close_matches(name, names, n=3 * n, cutoff=0.5)
    if layer is not None:
        own_prefix = layer.group(0)
        suffix = name[len(own_prefix) :]
        own = [c[len(own_prefix) :] for c in names if c.startswith(own_prefix)]
        own_close = [own_prefix + c for c in difflib.get_close_matches(suffix, own, n=n, cutoff=0.5)]
        close = own_close + [c for c in close if c not in own_close]
    return close[:n]


class HookedRootModule(nn.Module):
    """Base class of models whose activations pass through named `HookPoint`s.

    Subclasses build their modules, then call `setup()`, which indexes every hook
    point by its dotted name. Optional hook points (`HookPoint(requires=flag)`) fire
    only while `self.cfg.<flag>` is true.
    """

    def __init__(self) -> None:
        super().__init__()
        self.context_level = 0
        self.mod_dict: dict[str, nn.Module] = {}
        self.hook_dict: dict[str, HookPoint] = {}

    def __call__(self, *args, **kwargs):
        with exclusive(self):  # one thread at a time (hooked/core/thread_guard.py)
            return super().__call__(*args, **kwargs)

    def setup(self) -> None:
        """Index modules and hook points by name; re-run after swapping modules."""
        self.mod_dict, self.hook_dict = {}, {}
        for name, module in self.named_modules():
            if name == "":
                continue
            setattr(module, "name", name)  # noqa: B010 - a plain attribute; nn.Module's __setattr__ is typed for Tensor/Module
            self.mod_dict[name] = module
            if isinstance(module, HookPoint):
                self.hook_dict[name] = module
        install_fast_attributes(self)

    # `to` keeps cfg.device / cfg.dtype in step in the models; these shortcuts go through it
    def cuda(self, device=None):
        return self.to(f"cuda:{device}" if isinstance(device, int) else device or "cuda")

    def cpu(self):
        return self.to("cpu")

    def mps(self):
        return self.to("mps")

    def hook_points(self) -> Iterable[HookPoint]:
        return self.hook_dict.values()

    def is_active(self, hp: HookPoint) -> bool:
        """Whether an optional hook point's flag is on (always true for regular ones)."""
        return hp.requires is None or bool(getattr(getattr(self, "cfg", None), hp.requires, False))

    # -- resolving names -----------------------------------------------------------
    def _lookup(self, name: str) -> HookPoint:
        hp = self.hook_dict.get(name)
        if hp is None:
            close = close_hook_names(name, list(self.hook_dict))
            hint = f" Did you mean: {', '.join(close)}?" if close else ""
            raise KeyError(f"No hook point named {name!r}.{hint} (model.hook_dict lists all names.)")
        if not self.is_active(hp):
            raise HookNotEnabledError(self.hook_enable_hint(hp))
        return hp

    def _hook_name(self, key: str) -> str:
        """The full name of the hook point `key` looks up (an alias resolves to its target)."""
        name = self._lookup(key).name
        assert name is not None  # setup() names every hook point it indexes
        return name

    def hook_enable_hint(self, hp: HookPoint) -> str:
        """The message for a disabled optional hook point: which flag turns it on (models may refine it)."""
        return (
            f"Hook point {hp.name!r} is disabled: set cfg.{hp.requires}=True "
            f"(e.g. model.set_{hp.requires}(True)) to enable it."
        )

    def _resolve(self, name: str | Callable[[str], bool]) -> list[HookPoint]:
        if isinstance(name, str):
            return [self._lookup(name)]
        if callable(name):
            return [hp for n, hp in self.hook_dict.items() if self.is_active(hp) and name(n)]
        raise TypeError(f"A hook name must be a str or a Callable[[str], bool], got {type(name).__name__}")

    def _names_from_filter(self, names_filter: NameFilter) -> list[str]:
        names_filter = check_names_filter(names_filter)
        if names_filter is None:
            return [n for n, hp in self.hook_dict.items() if self.is_active(hp)]
        if isinstance(names_filter, str):
            return [self._hook_name(names_filter)]
        if callable(names_filter):
            return [n for n, hp in self.hook_dict.items() if self.is_active(hp) and names_filter(n)]
        return [self._hook_name(n) for n in names_filter]

    # -- adding and removing -------------------------------------------------------
    def check_hooks_to_add(self, hook_point, hook_point_name, hook, dir="fwd", is_permanent=False, prepend=False):
        """Override point, called for every hook addition."""

    def add_hook(
        self,
        name: str | Callable[[str], bool],
        hook: HookFunction,
        dir: Literal["fwd", "bwd"] = "fwd",
        is_permanent: bool = False,
        level: int | None = None,
        prepend: bool = False,
    ) -> None:
        """Add `hook` to the hook point `name`, or to every active one a predicate accepts.

        Args:
            name: an exact hook name (unknown names raise with close matches) or a predicate
                `name -> bool` over active hook points.
            hook: `fn(activation, hook) -> Tensor | None`; a returned tensor replaces the activation.
            dir: "fwd" (the activation) or "bwd" (its gradient).
            is_permanent: survive `reset_hooks()` unless `including_permanent=True`.
            level: a context level tag (`hooks()` removes its own level on exit).
            prepend: run before the hooks already on that point.
        """
        check_hook_fn(hook, repr(name) if isinstance(name, str) else "a name filter")
        with exclusive(self):  # never change hooks under another thread's running call
            for hp in self._resolve(name):
                self.check_hooks_to_add(hp, hp.name, hook, dir=dir, is_permanent=is_permanent, prepend=prepend)
                hp.add_hook(hook, dir=dir, is_permanent=is_permanent, level=level, prepend=prepend)

    def _enable_hook(self, name: str | Callable[[str], bool], hook: HookFunction, dir: Literal["fwd", "bwd"]) -> None:
        """TransformerLens's internal entry point: add a hook at the current context level."""
        if isinstance(name, str):
            self._enable_hook_with_name(name, hook, dir)
        else:
            self._enable_hooks_for_points(self.hook_dict.items(), name, hook, dir)

    def _enable_hook_with_name(self, name: str, hook: HookFunction, dir: Literal["fwd", "bwd"]) -> None:
        cast(HookPoint, self.mod_dict[name]).add_hook(hook, dir=dir, level=self.context_level)

    def _enable_hooks_for_points(self, hook_points, enabled: Callable[[str], bool], hook, dir) -> None:
        for name, hook_point in hook_points:
            if enabled(name):
                hook_point.add_hook(hook, dir=dir, level=self.context_level)

    def add_perma_hook(self, name, hook, dir: Literal["fwd", "bwd"] = "fwd") -> None:
        self.add_hook(name, hook, dir=dir, is_permanent=True)

    def remove_all_hook_fns(self, direction: Direction = "both", including_permanent: bool = False, level=None):
        with exclusive(self):
            for hp in self.hook_dict.values():
                hp.remove_hooks(direction, including_permanent=including_permanent, level=level)

    def clear_contexts(self) -> None:
        for hp in self.hook_dict.values():
            hp.clear_context()

    def reset_hooks(self, clear_contexts=True, direction: Direction = "both", including_permanent=False, level=None):
        if clear_contexts:
            self.clear_contexts()
        self.remove_all_hook_fns(direction, including_permanent, level=level)

    def list_hooks(self, name_filter=None, dir: Direction = "both", including_permanent=True):
        """`{name: [LensHandle, ...]}` for every hook point that has hooks."""
        names = set(self._names_from_filter(name_filter)) if name_filter is not None else None
        out = {}
        for name, hp in self.hook_dict.items():
            if names is not None and name not in names:
                continue
            handles = {"fwd": hp.fwd_hooks, "bwd": hp.bwd_hooks, "both": hp.fwd_hooks + hp.bwd_hooks}[dir]
            handles = [h for h in handles if including_permanent or not h.is_permanent]
            if handles:
                out[name] = handles
        return out

    @contextlib.contextmanager
    def hooks(self, fwd_hooks=(), bwd_hooks=(), reset_hooks_end: bool = True, clear_contexts: bool = False):
        """Context manager: hooks added on entry are removed on exit, even on an exception.

        Each `with` opens a new context level, so contexts nest: leaving an inner one
        removes only its own hooks.

        Args:
            fwd_hooks: `(name or predicate, fn)` pairs on activations.
            bwd_hooks: `(name or predicate, fn)` pairs on gradients.
            reset_hooks_end: remove the hooks on exit (False: leave them until `reset_hooks()`).
            clear_contexts: also clear each hook point's `ctx` dict on exit.

        Yields:
            The model itself.
        """
        fwd_hooks, bwd_hooks = check_hook_pairs(fwd_hooks, "fwd_hooks"), check_hook_pairs(bwd_hooks, "bwd_hooks")
        with exclusive(self):
            self.context_level += 1
            level = self.context_level
            try:
                for name, fn in fwd_hooks:
                    self.add_hook(name, fn, dir="fwd", level=level)
                for name, fn in bwd_hooks:
                    self.add_hook(name, fn, dir="bwd", level=level)
                yield self
            finally:
                if reset_hooks_end:
                    self.remove_all_hook_fns("both", including_permanent=False, level=level)
                    if clear_contexts:
                        self.clear_contexts()
                self.context_level -= 1

    def run_with_hooks(self, *args, fwd_hooks=(), bwd_hooks=(), reset_hooks_end=True, clear_contexts=False, **kwargs):
        """`forward(*args, **kwargs)` with the given hooks attached for this call only.

        Args:
            *args: the arguments of `forward`.
            fwd_hooks: `(name or predicate, fn)` pairs: `fn(activation, hook)` may edit the
                activation in place or return a replacement of the same shape.
            bwd_hooks: `(name or predicate, fn)` pairs on gradients (pass `reset_hooks_end=False`
                to keep them until you call `.backward()`).
            reset_hooks_end: remove the hooks when the call returns.
            clear_contexts: also clear each hook point's `ctx` dict.
            **kwargs: `forward`'s keywords.

        Returns:
            What `forward` returns.
        """
        if bwd_hooks and reset_hooks_end:
            logger.warning(
                "run_with_hooks got bwd_hooks with reset_hooks_end=True: they are removed before you can call "
                ".backward(). Pass reset_hooks_end=False and call reset_hooks() afterwards."
            )
        with self.hooks(fwd_hooks, bwd_hooks, reset_hooks_end, clear_contexts):
            return self(*args, **kwargs)

    # -- caching -------------------------------------------------------------------
    def get_caching_hooks(
        self,
        names_filter: NameFilter = None,
        incl_bwd: bool = False,
        device=None,
        remove_batch_dim: bool = False,
        cache: dict | None = None,
        pos_slice=None,
    ) -> tuple[dict, list, list]:
        """Hooks that store activations (and gradients with `incl_bwd`) into `cache`."""
        cache = {} if cache is None else cache
        check_pos_slice(pos_slice)
        index = _pos_index(pos_slice)

        def make_saver(key_suffix: str):
            def save(tensor: torch.Tensor, *, hook: HookPoint):
                t = tensor.detach()
                if remove_batch_dim:
                    if t.shape[0] != 1:
                        raise ValueError(
                            f"remove_batch_dim=True needs batch size 1, but {hook.name} has batch {t.shape[0]}"
                        )
                    t = t[0]
                if index is not None and hook.pos_axis is not None:
                    axis = hook.pos_axis - 1 if remove_batch_dim else hook.pos_axis
                    t = t[(slice(None),) * axis + (index,)]
                cache[f"{hook.name}{key_suffix}"] = t if device is None else t.to(device)

            save.reads_only = key_suffix == ""  # a forward saver never changes the activation
            return save

        names = self._names_from_filter(names_filter)
        fwd = [(n, make_saver("")) for n in names]
        bwd = [(n, make_saver("_grad")) for n in names] if incl_bwd else []
        return cache, fwd, bwd

    def add_caching_hooks(
        self, names_filter=None, incl_bwd=False, device=None, remove_batch_dim=False, cache=None, *, prepend=False
    ) -> dict:
        cache, fwd, bwd = self.get_caching_hooks(names_filter, incl_bwd, device, remove_batch_dim, cache)
        for name, fn in fwd:
            self.add_hook(name, fn, dir="fwd", prepend=prepend)
        for name, fn in bwd:
            self.add_hook(name, fn, dir="bwd", prepend=prepend)
        return cache

    def run_with_cache(
        self,
        *model_args,
        names_filter: NameFilter = None,
        device=None,
        remove_batch_dim: bool = False,
        incl_bwd: bool = False,
        reset_hooks_end: bool = True,
        clear_contexts: bool = False,
        pos_slice=None,
        **model_kwargs,
    ) -> tuple[Any, dict[str, torch.Tensor]]:
        """Run forward and return `(output, {hook_name: activation})`.

        Caching hooks run after any hooks already attached, so they record the
        post-intervention values. With `incl_bwd`, the output must be a scalar and
        gradients are stored under `name + "_grad"`.
        """
        if incl_bwd and not torch.is_grad_enabled():
            raise InputError(
                "run_with_cache(incl_bwd=True) caches gradients, but autograd is off here "
                "(torch.set_grad_enabled(False), "
                "torch.no_grad() or torch.inference_mode() is active). Run it inside `with torch.enable_grad():` "
                "or call torch.set_grad_enabled(True) first."
            )
        store = self._new_cache_store()
        cache, fwd, bwd = self.get_caching_hooks(names_filter, incl_bwd, device, remove_batch_dim, store, pos_slice)
        with self.hooks(fwd, bwd, reset_hooks_end=reset_hooks_end, clear_contexts=clear_contexts):
            out = self(*model_args, **model_kwargs)
            if incl_bwd:
                if not isinstance(out, torch.Tensor) or out.numel() != 1:
                    raise ValueError("incl_bwd=True needs a scalar output: pass return_type='loss'.")
                if not out.requires_grad:
                    raise InputError(
                        "run_with_cache(incl_bwd=True): the output does not depend on anything that requires grad "
                        "(every parameter has requires_grad=False?). Call model.requires_grad_(True) first."
                    )
                out.backward()
        return out, self._cache_dict_from(cache)

    # seams of run_with_cache: a pipelined model records each micro-batch's slice, then joins them
    def _new_cache_store(self) -> dict[str, torch.Tensor]:
        """The mapping `run_with_cache`'s hooks record into (a fresh dict)."""
        return {}

    def _cache_dict_from(self, store: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The `{hook_name: activation}` dict of what the hooks recorded into `store` (the store itself)."""
        return store


def _pos_index(pos_slice) -> Any:
    """Turn run_with_cache's `pos_slice` into an index for the position axis (None = all)."""
    if pos_slice is None:
        return None
    if isinstance(pos_slice, int):
        return slice(pos_slice, pos_slice + 1 if pos_slice != -1 else None)
    if isinstance(pos_slice, tuple):
        return slice(*pos_slice)
    if isinstance(pos_slice, slice):
        return pos_slice
    return torch.as_tensor(pos_slice)
