"""Gemma 3n's block: AltUp around a Gemma block with LAuReL, activation sparsity and a per-layer input.

On the streams `x [batch, pos, stream, d_model]` (`components/altup.py`), with `a` the active stream:

    p = altup.predict(x);  n = ln1(p_a)
    h = (p_a + ln1_post(attn(n)) + laurel(n)) / sqrt(2)            hook_resid_mid
    y = h + ln2_post(mlp(ln2(h)))                                  (the MLP's gate maybe sparse)
    c = altup.correct(p, y)
    c[:, :, 1:] += per_layer(scale(c_a), per_layer_inputs[:, :, layer])
                                                                   hook_resid_post = c
`hook_resid_pre`/`hook_resid_post` are the streams; `hook_attn_out`, `hook_resid_mid` and
`hook_mlp_out` are `[batch, pos, d_model]` on the active stream. The per-layer input is added to
every stream but the first (HF's `[1:]`, whatever the active stream).
"""

from __future__ import annotations

import math

import torch
from jaxtyping import Float, Int

from hooked.components.activation_sparsity import SparseGatedMLP
from hooked.components.altup import AltUp
from hooked.components.forward_state import ForwardState
from hooked.components.gemma4_block import layer_slice
from hooked.components.laurel import Laurel
from hooked.components.per_layer_inputs import PerLayerInput
from hooked.components.transformer_block import TransformerBlock
from hooked.core.config import HookedTransformerConfig
from hooked.core.hook_points import HookPoint


class Gemma3nBlock(TransformerBlock):
    """A `TransformerBlock`'s sublayers and norms, run on AltUp's active stream (module docstring)."""

    def __init__(self, cfg: HookedTransformerConfig, layer: int):
        super().__init__(cfg, layer)
        sparsity = (self.cfg.activation_sparsity or [0.0] * self.cfg.n_layers)[layer]
        if sparsity > 0:
            self.mlp = SparseGatedMLP(self.cfg, sparsity)
        self.altup = AltUp(self.cfg)
        if self.cfg.laurel_rank:
            self.laurel = Laurel(self.cfg)
        self.per_layer = PerLayerInput(self.cfg)
        self.hook_resid_pre = HookPoint()  # [batch, pos, stream, d_model]
        self.hook_resid_post = HookPoint()  # [batch, pos, stream, d_model]

    def forward(
        self,
        resid_pre: Float[torch.Tensor, "batch pos stream d_model"],
        state: ForwardState | None = None,
        shortformer_pos_embed: None = None,
        *,
        attention_mask: Int[torch.Tensor, "batch pos"] | None = None,
    ) -> Float[torch.Tensor, "batch pos stream d_model"]:
        if state is None:  # called alone: the state of a plain forward over its positions
            batch, n_pos = resid_pre.shape[:2]
            state = ForwardState.for_input(batch, n_pos, resid_pre.device, attention_mask)
        predictions = self.altup.predict(self.hook_resid_pre(resid_pre))  # [batch, pos, stream, d_model]
        active = predictions[:, :, self.cfg.altup_active_idx]  # [batch, pos, d_model]
        normed = self.ln1(active)
        attn_out = self.hook_attn_out(self.ln1_post(self.attn(normed, normed, normed, state)))
        mid = active + attn_out
        if hasattr(self, "laurel"):
            mid = (mid + self.laurel(normed)) / math.sqrt(2)
        mid = self.hook_resid_mid(mid)  # [batch, pos, d_model]
        activated = mid + self.hook_mlp_out(self.ln2_post(self.mlp(self.ln2(mid))))
        corrected = self.altup.correct(predictions, activated)  # [batch, pos, stream, d_model]
        first = corrected[:, :, self.cfg.altup_active_idx]
        if self.cfg.altup_correct_scale:
            first = self.altup.scale_corrected(first)
        per_layer = self.per_layer(first, layer_slice(state, self.layer))  # [batch, pos, d_model]
        out = torch.cat([corrected[:, :, :1], corrected[:, :, 1:] + per_layer[:, :, None]], dim=2)
        return self.hook_resid_post(out)  # [batch, pos, stream, d_model]
