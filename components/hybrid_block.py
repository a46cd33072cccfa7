"""Blocks of state-space and hybrid models: the token mixer of each block is chosen by `cfg.layer_types`.

A hybrid model is a list of layer types, not a model class of its own. Every block reads and writes
the residual stream as a transformer block does:

    resid_mid  = resid_pre + mixer(ln1(resid_pre))      hook_attn_out (attention) or hook_mixer_out
    resid_post = resid_mid + mlp(ln2(resid_mid))        hook_mlp_out

`attention` blocks are `TransformerBlock`'s (every attention option applies); the other mixers sit at
`blocks.{l}.mixer` with their own hooks (`components/mamba.py`, `mamba2.py`, `gated_deltanet.py`,
`short_conv.py`). With `cfg.single_sublayer_blocks` (Mamba, Mamba-2, Nemotron-H) a block holds one
sublayer: its token mixer (`resid_post = resid_pre + mixer(ln1(resid_pre))`), or for `mlp` layers its
MLP (`resid_post = resid_pre + mlp(ln2(resid_pre))`); such blocks have no `hook_resid_mid`.
"""

from __future__ import annotations

import torch
import torch.nn as nn
from jaxtyping import Float, Int

from hooked.components.forward_state import ForwardState
from hooked.components.norms import make_norm
from hooked.components.transformer_block import TransformerBlock
from hooked.core.config import HookedTransformerConfig
from hooked.core.hook_points import HookPoint


def mixer_class(kind: str) -> type[nn.Module]:
    """The module of a recurrent layer type (`mamba`, `mamba2`, `gated_deltanet` or `short_conv`)."""
    if kind == "mamba":
        from hooked.components.mamba import MambaMixer

        return MambaMixer
    if kind == "mamba2":
        from hooked.components.mamba2 import Mamba2Mixer

        return Mamba2Mixer
    if kind == "gated_deltanet":
        from hooked.components.gated_deltanet import GatedDeltaNet

        return GatedDeltaNet
    if kind == "short_conv":
        from hooked.components.short_conv import ShortConv

        return ShortConv
    raise ValueError(f"{kind!r} is not a recurrent layer type")


def make_mixer(cfg: HookedTransformerConfig, layer: int) -> nn.Module:
    """The recurrent token mixer of block `layer` (`cfg.layer_types[layer]` is not `attention` or `mlp`)."""
    return mixer_class(cfg.mixer_types[layer])(cfg, layer)


class HybridBlock(TransformerBlock):
    """A block whose token mixer is `cfg.layer_types[layer]`: attention, a recurrent mixer, or none (`mlp`).

    Attributes:
        kind: the layer type (`attention`, `mamba`, `mamba2`, `gated_deltanet`, `short_conv`, `mlp`).
    """

    def __init__(self, cfg: HookedTransformerConfig, layer: int):
        nn.Module.__init__(self)  # builds only the sublayers its layer type has (TransformerBlock builds both)
        cfg = cfg.layer_config(layer)  # the model's config, or a view with this layer's shapes
        self.cfg, self.layer = cfg, layer
        self.kind = cfg.mixer_types[layer]
        if self.kind == "attention":
            self._init_attention(cfg, layer)
        elif self.kind != "mlp":
            self.ln1 = make_norm(cfg)
            self.mixer = make_mixer(cfg, layer)
            self.hook_resid_pre = HookPoint()  # [batch, pos, d_model]
            self.hook_mixer_in = HookPoint()  # [batch, pos, d_model]: a copy of the stream the mixer reads (before ln1)
            self.hook_mixer_out = HookPoint()  # [batch, pos, d_model]: the mixer's write to the residual stream
        else:
            self.hook_resid_pre = HookPoint()  # [batch, pos, d_model]
        self.has_mlp = cfg.block_has_mlp(layer)
        if self.has_mlp:
            self._init_mlp(cfg, resid_mid=self.kind != "mlp")
        self.hook_resid_post = HookPoint()  # [batch, pos, d_model]

    def forward(
        self,
        resid_pre: Float[torch.Tensor, "batch pos d_model"],
        state: ForwardState | None = None,
        shortformer_pos_embed: Float[torch.Tensor, "batch pos d_model"] | None = None,
        *,
        attention_mask: Int[torch.Tensor, "batch pos"] | None = None,
    ) -> Float[torch.Tensor, "batch pos d_model"]:
        """One block; `state` is the model's (called alone, it is built from the input, with no cache)."""
        if state is None or isinstance(state, torch.Tensor):
            state = ForwardState.for_input(resid_pre.shape[0], resid_pre.shape[1], resid_pre.device, attention_mask)
        resid = self.hook_resid_pre(resid_pre)
        if self.kind == "attention":
            resid = resid + self.hook_attn_out(self._attention(resid, state, shortformer_pos_embed))
        elif self.kind != "mlp":
            mixer_in = self.hook_mixer_in(resid.clone() if self.hook_mixer_in.observed else resid)
            resid = resid + self.hook_mixer_out(self.mixer(self.ln1(mixer_in), state))
        if not self.has_mlp:
            return self.hook_resid_post(resid)
        if self.kind != "mlp":
            resid = self.hook_resid_mid(resid)
        return self.hook_resid_post(resid + self._mlp(resid))
