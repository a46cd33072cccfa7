"""Converters refuse what they do not implement.

A family converter reads the HF config fields it understands. A field it does not read can
still change what the HF model computes (a rope type, an attention variant, a routing mode):
loading such a checkpoint would give a model that runs, with other numbers. So each
converter states, for every field whose values it implements only in part, which values it
supports, and `require_supported` refuses any other with an `UnsupportedConfigError` naming
the family, the field, the value and what is implemented.

Two checks apply to every family and run where every converter passes: `require_activation`
(the MLP activation, by HF's name) and `require_rope_types`, which `loading.common.hf_rope_parameters`
calls with `ROPE_TYPES`, the rope kinds `components/rotary.py` computes.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any, NoReturn

from hooked.core.errors import UnsupportedConfigError

_UNSET = object()

#: HF's rope kinds that `components/rotary.py` computes ("default": no scaling)
ROPE_TYPES = ("default", "linear", "llama3", "yarn", "dynamic", "longrope", "proportional")
#: HF activation names (`ACT2FN`) -> hooked's `act_fn`: the ones hooked computes as HF does
HF_ACTIVATIONS = {
    "relu": "relu",
    "gelu": "gelu",
    "gelu_new": "gelu_new",
    "gelu_fast": "gelu_fast",
    "gelu_pytorch_tanh": "gelu_pytorch_tanh",
    "silu": "silu",
    "swish": "silu",
    "quick_gelu": "quick_gelu",  # CLIP's `x * sigmoid(1.702 x)`
}


def refuse(family: str, field: str, value: Any, implemented: str) -> NoReturn:
    """Raise `UnsupportedConfigError` for `config.field == value` of `family`; `implemented` says what is."""
    raise UnsupportedConfigError(
        f"{family}: config.{field}={value!r} is not implemented by hooked's converter ({implemented}); loading it "
        f"would give a model that computes something else than the checkpoint. Use a checkpoint without it, or "
        f"add it to the converter (docs/adding-an-architecture.md)."
    )


def require_supported(
    hf: Any,
    family: str,
    field: str,
    supported: Collection[Any] | Callable[[Any], bool],
    default: Any = None,
    describe: str | None = None,
) -> Any:
    """`getattr(hf, field, default)`, refused unless it is one of `supported` (or `supported(value)` is true).

    `field` may be a dotted path into a sub-config or dict (`"attn_config.qk_ln"`). `describe` says what
    is implemented when `supported` is a predicate (a collection describes itself).
    """
    value = config_value(hf, field, default)
    ok = supported(value) if callable(supported) else value in supported
    if not ok:
        implemented = describe or f"supported: {', '.join(repr(v) for v in supported)}"  # type: ignore[union-attr]
        refuse(family, field, value, implemented)
    return value


def family_of(hf: Any) -> str:
    """A family name for messages: the HF config class without `Config` (`LlamaConfig` -> `Llama`)."""
    return type(hf).__name__.removesuffix("Config")


def require_activation(
    hf: Any, field: str, family: str | None = None, extra: Collection[str] = (), path: str | None = None
) -> str:
    """hooked's `act_fn` for the HF activation `config.<field>`, refused unless hooked computes it.

    `extra` admits names only some converters load (Apertus's trainable `xielu`); `path` names the
    field in the message when `hf` is a sub-config (`vision_config.hidden_act`).
    """
    value = config_value(hf, field)
    if value in extra:
        return value
    if value not in HF_ACTIVATIONS:
        supported = ", ".join(sorted({*HF_ACTIVATIONS, *extra}))
        refuse(family or family_of(hf), path or field, value, f"supported: {supported}")
    return HF_ACTIVATIONS[value]


def config_value(hf: Any, field: str, default: Any = None) -> Any:
    """`hf.<field>` along a dotted path, through sub-configs and dicts; `default` where a step is missing."""
    value = hf
    for name in field.split("."):
        value = value.get(name, _UNSET) if isinstance(value, dict) else getattr(value, name, _UNSET)
        if value is _UNSET:
            return default
    return value


def require_rope_types(hf: Any, family: str, kinds: Collection[str], layer_type: str | None = None) -> None:
    """Refuse a rope scaling kind (`rope_parameters["rope_type"]`, or 4.x's `rope_scaling`) not in `kinds`.

    `"default"` (no scaling) must be listed to be accepted.
    """
    params = getattr(hf, "rope_parameters", None)
    if params is None:
        params = getattr(hf, "rope_scaling", None)
    params = dict(params or {})
    field = "rope_parameters['rope_type']"
    if layer_type is not None and isinstance(params.get(layer_type), dict):
        field = f"rope_parameters[{layer_type!r}]['rope_type']"
        params = dict(params[layer_type])
    kind = params.get("rope_type") or params.get("type") or "default"
    if kind not in kinds:
        refuse(family, field, kind, f"supported: {', '.join(sorted(kinds))}")
