"""Helpers shared by the architecture converters."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from jaxtyping import Float

from hooked.loading.config_checks import ROPE_TYPES, family_of, require_rope_types

# HF `hidden_act` / `activation_function` names -> `cfg.act_fn`.
ACT_FN_NAMES = {"swish": "silu", "gelu_pytorch_tanh": "gelu_pytorch_tanh", "gelu_new": "gelu_new"}


def act_fn_name(hf_name: str) -> str:
    """hooked's `act_fn` for an HF activation name (most names are the same)."""
    return ACT_FN_NAMES.get(hf_name, hf_name)


class PrefixView(Mapping):
    """A read-only view of a state dict with a key prefix removed (lazy: nothing is loaded)."""

    def __init__(self, state: Mapping[str, torch.Tensor], prefix: str):
        self.state, self.prefix = state, prefix

    def __getitem__(self, key: str) -> torch.Tensor:
        if self.prefix + key in self.state:
            return self.state[self.prefix + key]
        return self.state[key]

    def __contains__(self, key) -> bool:
        return self.prefix + key in self.state or key in self.state

    def __iter__(self):
        return (k.removeprefix(self.prefix) for k in self.state)

    def __len__(self) -> int:
        return len(self.state)


def strip_prefix(state: Mapping[str, torch.Tensor], prefix: str) -> Mapping[str, torch.Tensor]:
    """Accept both `transformer.h.0...` (full model) and `h.0...` (base model) keys."""
    return PrefixView(state, prefix)


def heads_in(weight: torch.Tensor, n_heads: int, d_head: int) -> torch.Tensor:
    """HF Linear weight `[head*d_head, d_model]` -> `[head, d_model, d_head]` (a view)."""
    return weight.T.reshape(weight.shape[1], n_heads, d_head).permute(1, 0, 2)


def heads_out(weight: torch.Tensor, n_heads: int, d_head: int) -> torch.Tensor:
    """HF Linear weight `[d_model, head*d_head]` -> `[head, d_head, d_model]` (a view)."""
    return weight.T.reshape(n_heads, d_head, weight.shape[0])


# Keys of an HF rope dict that `HookedTransformerConfig` stores in fields of their own.
_ROPE_OWN_FIELDS = ("rope_theta", "partial_rotary_factor")


def hf_rope_parameters(hf, default_theta: float = 10000.0, layer_type: str | None = None) -> tuple[float, dict | None]:
    """`(rotary_base, rotary_scaling)` from an HF config, for transformers 4.x and 5.x alike.

    transformers 5 keeps everything in `config.rope_parameters` (`rope_theta`, `rope_type`
    and the scaling fields); 4.x has a top-level `rope_theta` and an optional `rope_scaling`
    dict whose kind is under `rope_type` (or the older `type`). The scaling dict comes back
    with `rope_type` normalised, without the fields `rotary_base`/`rotary_dim` hold, and as
    None for the unscaled `default` kind. Like HF, `llama3` falls back to
    `max_position_embeddings` when `original_max_position_embeddings` is absent.
    Per-layer-type parameters (`{"sliding_attention": {...}, "full_attention": {...}}`,
    Gemma 3, OLMo 3) are read for `layer_type`; see `per_layer_type_rope`.
    """
    require_rope_types(hf, family_of(hf), ROPE_TYPES, layer_type)  # refuse a kind components/rotary.py lacks
    params = getattr(hf, "rope_parameters", None)
    if params is None:  # transformers 4.x
        params = getattr(hf, "rope_scaling", None)
    params = dict(params or {})
    if is_per_layer_type(params):
        if layer_type not in params:
            raise NotImplementedError(
                f"Per-layer-type rope parameters {sorted(params)}: name the layer type to read (layer_type=)"
            )
        params = dict(params[layer_type] or {})
    theta = params.get("rope_theta", getattr(hf, "rope_theta", None) or default_theta)
    kind = params.get("rope_type") or params.get("type") or "default"
    if kind == "default":
        return float(theta), None
    own = ("rope_theta", "type") if kind == "proportional" else (*_ROPE_OWN_FIELDS, "type")  # its fraction shapes
    scaling = {k: v for k, v in params.items() if k not in own}  # the frequencies, not rotary_dim (Gemma 4)
    scaling["rope_type"] = kind
    if kind == "llama3":
        scaling.setdefault("original_max_position_embeddings", hf.max_position_embeddings)
    return float(theta), complete_length_scaling(hf, scaling)


def complete_length_scaling(hf, scaling: dict) -> dict:
    """Fill what HF derives from the model config for `yarn`, `longrope` and `dynamic`, so the dict is self-contained.

    YaRN/LongRoPE: `original_max_position_embeddings` (a top-level attribute wins, as Phi-3
    stores it) and a missing `factor` = `max_position_embeddings / original`. Dynamic NTK:
    `max_position_embeddings`, the length beyond which the base grows.
    """
    kind = scaling["rope_type"]
    if kind in ("yarn", "longrope"):
        original = getattr(hf, "original_max_position_embeddings", None)
        original = original or scaling.get("original_max_position_embeddings") or hf.max_position_embeddings
        scaling["original_max_position_embeddings"] = original
        if scaling.get("factor") is None:
            scaling["factor"] = hf.max_position_embeddings / original
    if kind == "dynamic":
        scaling["max_position_embeddings"] = hf.max_position_embeddings
    return scaling


def is_per_layer_type(params: Mapping | None) -> bool:
    """Whether an HF `rope_parameters` dict holds one dict per layer type."""
    return bool(params) and all(isinstance(v, dict) or v is None for v in params.values())


def per_layer_type_rope(hf, local_type: str = "sliding_attention", global_type: str = "full_attention") -> dict:
    """Config fields for the rotary of each layer type: global layers `rotary_base`/`rotary_scaling`,
    local (sliding) layers `rotary_base_local`/`rotary_scaling_local`.

    A config with one shared `rope_parameters` dict gives the global fields only, so
    every layer shares them.
    """
    params = getattr(hf, "rope_parameters", None)
    if not is_per_layer_type(params):
        base, scaling = hf_rope_parameters(hf)
        return dict(rotary_base=base, rotary_scaling=scaling)
    base, scaling = hf_rope_parameters(hf, layer_type=global_type)
    fields = dict(rotary_base=base, rotary_scaling=scaling)
    if params is not None and local_type in params:  # (is_per_layer_type is False for None)
        local_base, local_scaling = hf_rope_parameters(hf, layer_type=local_type)
        fields.update(rotary_base_local=local_base, rotary_scaling_local=local_scaling)
    return fields


def bias_or_zeros(
    hf: Mapping[str, torch.Tensor], key: str, size: int, like: torch.Tensor
) -> Float[torch.Tensor, "size"]:
    """The bias stored under `key`, or zeros of `size` (HF omits biases a layer was built without)."""
    bias = hf.get(key)
    return bias if bias is not None else torch.zeros(size, dtype=like.dtype, device=like.device)


def unembed_weights(
    lm_head: Float[torch.Tensor, "d_vocab d_model"] | None,
    W_E: Float[torch.Tensor, "d_vocab d_model"],
    bias: Float[torch.Tensor, "d_vocab"] | None = None,
) -> dict[str, torch.Tensor]:
    """`unembed.W_U` `[d_model, d_vocab]` and `unembed.b_U` from an HF `lm_head.weight` `[d_vocab, d_model]`.

    `b_U` is the `lm_head` bias (GPT-J, Phi), or zeros.

    A missing `lm_head`, or one sharing `W_E`'s storage, means tied embeddings: `W_U` is
    then the transposed view `W_E.T`, so both names keep pointing at one tensor.
    """
    tied = lm_head is None or lm_head.data_ptr() == W_E.data_ptr()
    W_U = W_E.T if tied or lm_head is None else lm_head.T  # [d_model, d_vocab]
    if bias is None:
        bias = torch.zeros(W_U.shape[1], dtype=W_U.dtype, device=W_U.device)
    return {"unembed.W_U": W_U, "unembed.b_U": bias}
