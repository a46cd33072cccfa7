"""Gemma 4's block: Gemma 3's sandwich-norm block, then the layer's per-layer input and a learned scalar.

    x += ln1_post(attn(ln1(x)));  x += ln2_post(mlp(ln2(x)))        (as `TransformerBlock`)
    x += per_layer(x, per_layer_inputs[:, :, layer])                  (`components/per_layer_inputs.py`)
    x *= layer_scalar                                                 (a `[1]` buffer from the checkpoint)

The scalar multiplies the whole residual stream, not a sublayer's output: `hook_resid_post` is
the scaled stream, and a layer's writes no longer sum to the difference of its `resid_pre` and
`resid_post` unless the scalar is 1.
"""

from __future__ import annotations

import torch
from jaxtyping import Float

from hooked.components.forward_state import ForwardState
from hooked.components.per_layer_inputs import PerLayerInput
from hooked.components.transformer_block import TransformerBlock
from hooked.core.config import HookedTransformerConfig
from hooked.core.errors import InputError


class Gemma4Block(TransformerBlock):
    """A `TransformerBlock` that adds its per-layer input after the MLP and scales the stream it returns."""

    def __init__(self, cfg: HookedTransformerConfig, layer: int):
        super().__init__(cfg, layer)
        if self.cfg.d_per_layer_input:
            self.per_layer = PerLayerInput(self.cfg)
        if self.cfg.layer_scalar:  # a buffer, as HF's: loaded, cast with the model, never trained or initialised
            self.register_buffer("layer_scalar", torch.ones(1, dtype=self.cfg.dtype))

    def _finish(self, resid: Float[torch.Tensor, "batch pos d_model"], state: ForwardState) -> torch.Tensor:
        if hasattr(self, "per_layer"):
            resid = resid + self.per_layer(resid, layer_slice(state, self.layer))
        if hasattr(self, "layer_scalar"):
            resid = resid * self.get_buffer("layer_scalar")  # [1]
        return resid


def layer_slice(state: ForwardState, layer: int) -> Float[torch.Tensor, "batch pos d_ple"]:
    """Layer `layer`'s per-layer input of this call, `[batch, pos, d_ple]`."""
    if state.per_layer_inputs is None:
        raise InputError(
            "this block needs the per-layer inputs (Gemma 3n/4), which are built from the tokens: run the model "
            "from tokens, or pass tokens= with start_at_layer"
        )
    return state.per_layer_inputs[:, :, layer]
