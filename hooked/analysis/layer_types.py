"""Which hooks each block of a state-space or hybrid model has, and clear errors for those it lacks.

A hybrid's blocks differ (`cfg.layer_types`): an attention block has `attn.*` and `hook_attn_out`, a
recurrent block `mixer.*` and `hook_mixer_out`, a Nemotron-H `mlp` block only its MLP. Methods written
for attention (per-head results, patterns, head detectors) work on the attention layers and refuse
the others with a `LayerTypeError` naming the layer type, instead of a bare missing-key error.
"""

from __future__ import annotations

import re

from hooked.core.errors import LayerTypeError

_BLOCK_HOOK = re.compile(r"^blocks\.(\d+)\.(attn\.|mlp\.|mixer\.|hook_attn_out$|hook_mixer_out$|hook_mlp_out$)")
_DESCRIBE = {
    "mamba": "a Mamba (selective scan) layer",
    "mamba2": "a Mamba-2 (SSD) layer",
    "gated_deltanet": "a gated DeltaNet layer",
    "short_conv": "an LFM2 short-convolution layer",
    "mlp": "an MLP-only layer",
    "attention": "an attention layer",
}


def describe_layer(cfg, layer: int) -> str:
    """`"layer 3 is a Mamba-2 (SSD) layer"`."""
    return f"layer {layer} is {_DESCRIBE.get(cfg.mixer_types[layer], cfg.mixer_types[layer])}"


def absent_sublayer(cfg, name: str) -> str | None:
    """Why hook or weight `name` (`blocks.{l}.attn.hook_z`, `blocks.{l}.hook_mlp_out`, ...) cannot exist on this
    model because block l has no such sublayer, with what to read instead; None when it may exist."""
    match = _BLOCK_HOOK.match(name)
    if cfg.layer_types is None or match is None or int(match.group(1)) >= cfg.n_layers:
        return None
    layer, part = int(match.group(1)), match.group(2)
    kind = cfg.mixer_types[layer]
    if part in ("attn.", "hook_attn_out") and kind != "attention":
        where = f"blocks.{layer}.mixer.* and blocks.{layer}.hook_mixer_out" if kind != "mlp" else "its MLP only"
        return f"{name!r}: {describe_layer(cfg, layer)}, with no attention (it has {where}); attention layers: " + str(
            cfg.attention_layers
        )
    if part in ("mixer.", "hook_mixer_out") and kind in ("attention", "mlp"):
        return f"{name!r}: {describe_layer(cfg, layer)}; recurrent layers: {cfg.recurrent_layers}"
    if part in ("mlp.", "hook_mlp_out") and not cfg.block_has_mlp(layer):
        return f"{name!r}: {describe_layer(cfg, layer)}, whose block has no MLP"
    return None


def check_present(cfg, names: list[str]) -> None:
    """Raise `LayerTypeError` for the first of `names` that no block of this model can have."""
    for name in names:
        problem = absent_sublayer(cfg, name)
        if problem is not None:
            raise LayerTypeError(problem)


def require_attention_layer(cfg, layer: int, what: str) -> None:
    """Raise `LayerTypeError` unless `layer`'s token mixer is attention (`what` names the refused method)."""
    if cfg.mixer_types[layer] != "attention":
        raise LayerTypeError(
            f"{what} needs attention, but {describe_layer(cfg, layer)}. It works on the attention layers "
            f"{cfg.attention_layers}; a recurrent layer's intermediates are hooked under blocks.{layer}.mixer."
        )
