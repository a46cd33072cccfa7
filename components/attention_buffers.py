"""TransformerLens's per-layer attention buffers (`mask`, `IGNORE`, `rotary_sin`, `rotary_cos`), on demand.

TransformerLens keeps an `[n_ctx, n_ctx]` causal mask, the `-inf` fill value and the
`[n_ctx, rotary_dim]` rotary tables as buffers of every attention layer. `hooked` builds
masks and tables per forward call instead, so nothing is stored by default. Reading one
of these names builds the TransformerLens tensor and registers it as a (non-persistent)
buffer of that layer; assigning one stores the given tensor. From then on that layer's
forward uses the stored tensor, exactly as TransformerLens reads its buffers, so a tool
that edits or shares them (circuit-tracer gives every layer one shared mask) changes
what the model computes. `del attn.mask` returns the layer to per-call masks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from jaxtyping import Bool, Float

from hooked.components.forward_state import ForwardState
from hooked.components.rotary import rotary_cos_sin
from hooked.core.config import HookedTransformerConfig
from hooked.core.errors import InputError

TL_BUFFERS = ("mask", "IGNORE", "rotary_sin", "rotary_cos")

# the host class is a module: the type checker sees nn.Module's methods, the runtime MRO is unchanged
if TYPE_CHECKING:
    _ModuleBase = torch.nn.Module
else:
    _ModuleBase = object


def _store(module: torch.nn.Module, name: str, value: torch.Tensor) -> None:
    """Register `value` as a non-persistent buffer (not in `state_dict`, moved by `.to()`)."""
    module._buffers[name] = value
    module._non_persistent_buffers_set.add(name)


def _buffer_property(name: str, doc: str) -> property:
    def get(self):
        stored = self._buffers.get(name)
        if stored is None:
            stored = self._default_tl_buffer(name)
            _store(self, name, stored)
        return stored

    def set_(self, value):
        if not isinstance(value, torch.Tensor):
            raise InputError(f"attn.{name} must be a tensor (got {type(value).__name__}); del attn.{name} to reset it")
        _store(self, name, value)

    return property(get, set_, doc=doc)


class AttentionBuffers(_ModuleBase):
    """Mixin for `Attention`: TransformerLens's buffers as lazily built, assignable attributes.

    An attention layer saved on its own (`attn.state_dict()`, not as part of a model) carries
    these buffers as TransformerLens's does, and loading such a state dict takes them back
    (stored only where they differ from the defaults); a model's state dict never has them.
    """

    # set by `Attention.__init__`; declared here for the type checker
    cfg: HookedTransformerConfig
    layer: int
    rotary: bool
    window: int | None
    W_Q: torch.nn.Parameter
    _rope: tuple
    inv_freq: torch.Tensor

    def _init_attention_buffers(self) -> None:
        self.register_state_dict_post_hook(_add_tl_buffers)
        self.register_load_state_dict_pre_hook(_take_tl_buffers)

    def _tl_buffer_names(self) -> tuple[str, ...]:
        return TL_BUFFERS if self.rotary else TL_BUFFERS[:2]

    mask = _buffer_property("mask", "`[n_ctx, n_ctx]` bool, True where a query (row) may see a key (column).")
    IGNORE = _buffer_property("IGNORE", "0-dim float: the score given to masked positions (`-inf`).")
    rotary_sin = _buffer_property("rotary_sin", "`[n_ctx, rotary_dim]` sin table of rotary layers.")
    rotary_cos = _buffer_property("rotary_cos", "`[n_ctx, rotary_dim]` cos table of rotary layers.")

    def _default_tl_buffer(self, name: str) -> torch.Tensor:
        cfg, device = self.cfg, self.W_Q.device
        if name == "mask":
            causal = torch.ones(cfg.n_ctx, cfg.n_ctx, dtype=torch.bool, device=device).tril()  # [n_ctx, n_ctx]
            return causal if self.window is None else causal.triu(1 - self.window)
        if name == "IGNORE":
            return torch.tensor(-torch.inf, device=device)
        if not self.rotary:
            raise AttributeError(f"'{type(self).__name__}' has no {name}: this layer has no rotary embedding")
        positions = torch.arange(cfg.n_ctx, device=device)[None]  # [1, n_ctx]
        base, scaling, attention_factor, _ = self._rope
        dtype = torch.float32 if cfg.rotary_tables_in_fp32 else cfg.dtype
        cos, sin = rotary_cos_sin(positions, self.inv_freq, cfg.rotary_adjacent_pairs, dtype, attention_factor)
        return (cos if name == "rotary_cos" else sin)[0, :, 0]  # [n_ctx, rotary_dim]

    def _stored_masking(self) -> bool:
        """Whether this layer masks with a stored `mask`/`IGNORE` rather than per-call masks."""
        buffers = self._buffers
        return "mask" in buffers or "IGNORE" in buffers

    def _stored_allowed(self, state: ForwardState) -> Bool[torch.Tensor, "batch 1 n_queries n_keys"] | None:
        """TransformerLens's `mask[-n_queries:, -n_keys:]` (bottom-right block), and the padding mask."""
        mask = self._buffers.get("mask")
        if mask is None or not state.causal:
            return state.allowed(self.window)
        if state.n_keys > mask.shape[0]:
            raise InputError(
                f"layer {self.layer}'s stored attn.mask is {tuple(mask.shape)}, too small for {state.n_keys} keys: "
                f"assign a mask of at least [{state.n_keys}, {state.n_keys}], or `del attn.mask` for per-call masks"
            )
        allowed = mask[-state.n_queries :, -state.n_keys :].to(state.positions.device)[None, None]  # [1, 1, q, k]
        if state.attention_mask is not None:
            allowed = allowed & state.attention_mask.bool()[:, None, None, :]  # [batch, 1, q, k]
        return allowed

    def _ignore_value(self) -> torch.Tensor | float:
        ignore = self._buffers.get("IGNORE")
        return float("-inf") if ignore is None else ignore

    def _stored_cos_sin(
        self, state: ForwardState, dtype: torch.dtype
    ) -> tuple[Float[torch.Tensor, "batch pos 1 rot"], Float[torch.Tensor, "batch pos 1 rot"]]:
        """The stored tables' rows at this call's positions, as TransformerLens indexes them."""
        cos, sin = self.rotary_cos, self.rotary_sin
        needed = int(state.positions.max()) + 1
        if needed > min(cos.shape[0], sin.shape[0]):
            raise InputError(
                f"layer {self.layer}'s stored rotary tables have {min(cos.shape[0], sin.shape[0])} rows, too few for "
                f"position {needed - 1}: assign longer tables, or `del attn.rotary_cos, attn.rotary_sin` "
                "for per-call tables"
            )
        positions = state.positions.to(cos.device)
        return cos[positions][:, :, None].to(dtype), sin[positions][:, :, None].to(dtype)  # [batch, pos, 1, rot]


def _add_tl_buffers(module: AttentionBuffers, state_dict, prefix: str, local_metadata) -> None:
    """State-dict post-hook: a standalone layer's state dict gets TransformerLens's buffers."""
    if prefix:  # part of a larger module: hooked's own format, no n_ctx² buffers per layer
        return
    for name in module._tl_buffer_names():
        # built, not stored: reading `module.mask` would store it and switch the layer to the stored-buffer
        # path, and a state dict taken for inspection (accelerate's dispatch does) must change nothing
        stored = module._buffers.get(name)
        state_dict[name] = (stored if stored is not None else module._default_tl_buffer(name)).detach()


def _take_tl_buffers(module: AttentionBuffers, state_dict, prefix, local_metadata, strict, missing, unexpected, errors):
    """Load pre-hook: TransformerLens's buffers in a state dict are taken, kept where they differ from the defaults."""
    for name in TL_BUFFERS:
        value = state_dict.pop(prefix + name, None)
        if value is None or (name.startswith("rotary") and not module.rotary):
            continue
        default = module._default_tl_buffer(name)
        if value.shape != default.shape or not torch.equal(value.to(default.device), default):
            _store(module, name, value.to(default.device))
