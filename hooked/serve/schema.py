"""The request schema of `hooked serve`, written once: `hooked.remote` builds requests with it and
the server reads them with it.

A request is a safetensors message (`hooked.serve.wire`) whose JSON body names an operation
(`op`) and its fields, and whose tensors hold the token ids, masks and the tensors of
interventions and metrics. Each operation is an `Op`: its fields (name, JSON type, default,
bounds) and the tensors it reads. `Op.body(...)` is the client's side (a body with only the
fields that differ from their defaults), `Op.read(body)` the server's (every field typed and
bounded, the defaults filled in, unknown fields refused with a 422 naming them).

The options of `generate` are not restated here: the `generate` operation carries the fields of
`hooked.generation.options.GenerationOptions` that are plain data (`GENERATION_FIELDS`), with
its types and defaults, and the server rebuilds a `GenerationOptions` from them, which checks
their values as a local call does.
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from dataclasses import dataclass
from typing import Any

from hooked.core.errors import WireError
from hooked.generation.options import OPTION_NAMES, GenerationOptions

#: `GenerationOptions` fields the client handles itself: text handling (`prepend_bos`, `padding_side`,
#: `return_type`), the progress bar (`verbose`), and two sent in another form (`fwd_hooks` as the
#: `hooks` field, `names_filter` as a list of names).
CLIENT_SIDE_GENERATION = ("prepend_bos", "padding_side", "return_type", "verbose", "fwd_hooks", "names_filter")
#: Options a remote `generate` refuses unless left at their defaults: they are not data a server can
#: take (`generator`, `device`), or the static cache's, which the server leaves at their defaults.
LOCAL_ONLY_GENERATION = ("generator", "device", "cache_implementation", "compile", "static_options")
#: `GenerationOptions` fields a `generate` request carries: every other field, in the dataclass's
#: order. A new field travels unless it is placed above (and one with no JSON form must be).
GENERATION_FIELDS = tuple(name for name in OPTION_NAMES if name not in CLIENT_SIDE_GENERATION + LOCAL_ONLY_GENERATION)
#: Bounds the server puts on generation options beyond what `GenerationOptions` checks (sane numbers on the wire).
GENERATION_BOUNDS: dict[str, tuple[float, float]] = {
    "temperature": (0.0, 100.0),
    "freq_penalty": (-100.0, 100.0),
    "repetition_penalty": (0.0, 100.0),
    "seed": (0, 2**63 - 1),
    "top_p": (0.0, 1.0),
}
#: Tensor names a request may hold: inputs, the patching index, intervention tensors (`h<i>...`), a metric's.
TENSOR_NAME = re.compile(
    r"(tokens|attention_mask|clean_tokens|clean_attention_mask|index|metric\.direction|h\d{1,3}(\.\d{1,3}){0,3})"
)


@dataclass(frozen=True)
class Field:
    """One JSON field of a request: its types, default and bounds (`lo`, `hi`, inclusive)."""

    name: str
    kinds: tuple[type, ...]
    default: Any = None
    lo: float | None = None
    hi: float | None = None
    required: bool = False

    def read(self, body: dict, bounds: tuple[float | None, float | None] | None = None) -> Any:
        """`body[name]` checked (a 422 naming the field otherwise), or the default when absent."""
        value = body.get(self.name)
        if value is None:
            if self.required:
                raise WireError(f"missing field {self.name!r}", 422)
            return self.default
        numeric = any(k in (int, float) for k in self.kinds)
        if not isinstance(value, self.kinds) or (isinstance(value, bool) and numeric and bool not in self.kinds):
            wanted = " or ".join(k.__name__ for k in self.kinds)
            raise WireError(f"field {self.name!r} must be {wanted}, got {type(value).__name__}", 422)
        lo, hi = bounds or (self.lo, self.hi)
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if number and ((lo is not None and value < lo) or (hi is not None and value > hi)):
            raise WireError(f"field {self.name!r} = {value} is outside [{lo}, {hi}]", 422)
        return value


@dataclass(frozen=True)
class Op:
    """One operation of the wire: its name, fields and the tensors it reads."""

    name: str
    fields: tuple[Field, ...]
    tensors: tuple[str, ...] = ()

    @property
    def field_names(self) -> set[str]:
        return {"op", *(f.name for f in self.fields)}

    def read(self, body: dict, bounds: dict[str, tuple[float | None, float | None]] | None = None) -> dict[str, Any]:
        """Every field of `body`, typed and bounded, defaults filled in (the server's side).

        `bounds` overrides a field's bounds with the server's limits (e.g. `max_new_tokens`).
        """
        unknown = set(body) - self.field_names
        if unknown:
            raise WireError(f"unknown field(s) {sorted(unknown)!r:.200}; accepted: {sorted(self.field_names)}", 422)
        bounds = bounds or {}
        return {f.name: f.read(body, bounds.get(f.name)) for f in self.fields}

    def body(self, **values) -> dict[str, Any]:
        """The JSON body of a request (the client's side): `op`, then each given field that is not
        its default. Fields are checked as the server will check them, so mistakes fail here."""
        fields = {f.name: f for f in self.fields}
        unknown = set(values) - set(fields)
        if unknown:
            raise WireError(f"{self.name} has no field(s) {sorted(unknown)}", 422)
        body: dict[str, Any] = {"op": self.name}
        for name, value in values.items():
            if value is not None and not _same(value, fields[name].default):
                body[name] = value
        self.read(body)
        return body


def _same(a, b) -> bool:
    return type(a) is type(b) and a == b


# -- generation options, from GenerationOptions -------------------------------------------------
def _kinds(hint) -> tuple[type, ...]:
    """The JSON types of a `GenerationOptions` annotation (`int | None` -> (int,), `float` -> (int, float))."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        return tuple(k for arg in typing.get_args(hint) if arg is not type(None) for k in _kinds(arg))
    origin = typing.get_origin(hint) or hint
    if origin is float:
        return (int, float)
    if origin in (int, bool, str, list):
        return (origin,)
    raise TypeError(f"GenerationOptions field of type {hint!r} has no JSON form")


def generation_fields() -> tuple[Field, ...]:
    """The wire fields of `GENERATION_FIELDS`, with `GenerationOptions`' types and defaults."""
    hints = typing.get_type_hints(GenerationOptions)
    defaults = {f.name: f.default for f in dataclasses.fields(GenerationOptions)}
    out = []
    for name in GENERATION_FIELDS:
        lo, hi = GENERATION_BOUNDS.get(name, (None, None))
        out.append(Field(name, _kinds(hints[name]), defaults[name], lo, hi))
    return tuple(out)


# -- the operations -----------------------------------------------------------------------------
HOOKS = Field("hooks", (list,), [])
METRIC = Field("metric", (dict,), required=True)

FORWARD = Op(
    "forward",
    (HOOKS, Field("cache", (list,)), Field("return_logits", (bool,), True)),
    ("tokens", "attention_mask"),
)
GENERATE = Op("generate", (HOOKS, Field("names_filter", (list,)), *generation_fields()), ("tokens", "attention_mask"))
PATCH = Op(
    "patch",
    (
        METRIC,
        Field("function", (str,)),
        Field("setter", (str,)),
        Field("activation", (str,)),
        Field("axes", (list,)),
        Field("batch_size", (int,), None, 1, 1024),
        Field("chunk", (int,), 64, 1, 100_000),
    ),
    ("tokens", "clean_tokens", "clean_attention_mask", "index"),
)
ATTRIBUTION = Op(
    "attribution",
    (
        METRIC,
        Field("names", (list,), required=True),
        Field("method", (str,), "atp"),
        Field("steps", (int,), 32, 1, 256),
        Field("sum_batch", (bool,), False),
        Field("recompute_softmax", (bool,), False),
        Field("grad_drop", (bool,), False),
        Field("steps_per_forward", (int,), None, 1, 256),
    ),
    ("tokens", "clean_tokens", "attention_mask"),
)
OPS: dict[str, Op] = {op.name: op for op in (FORWARD, GENERATE, PATCH, ATTRIBUTION)}


def op_of(body: dict) -> Op:
    """The operation a body names (a 422 listing the known ones otherwise)."""
    name = body.get("op")
    op = OPS.get(name) if isinstance(name, str) else None
    if op is None:
        raise WireError(f"unknown op {body.get('op')!r:.40}; known: {sorted(OPS)}", 422)
    return op


def check_tensor_names(tensors: dict) -> None:
    """Refuse tensors no operation reads (a 422 naming a few)."""
    unexpected = sorted(k for k in tensors if not TENSOR_NAME.fullmatch(k))
    if unexpected:
        raise WireError(f"unexpected tensor name(s) {unexpected[:5]!r:.200}", 422)


__all__ = [
    "ATTRIBUTION",
    "FORWARD",
    "GENERATE",
    "GENERATION_FIELDS",
    "LOCAL_ONLY_GENERATION",
    "OPS",
    "PATCH",
    "Field",
    "Op",
    "check_tensor_names",
    "generation_fields",
    "op_of",
]
