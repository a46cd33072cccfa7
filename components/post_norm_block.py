"""Post-norm blocks (OLMo-2, OLMo-3): each sublayer's output is normalized before the residual add.

    x = x + ln1(attn(x))
    x = x + ln2(mlp(x))

There is no pre-norm, so `ln1` fires after `attn.hook_z` and `ln2` after `mlp.hook_post`,
and `hook_attn_out`/`hook_mlp_out` are the normalized outputs. Nothing reads a
normalized residual stream, so `fold_ln` and `center_writing_weights` do not apply
(weight processing skips them with a warning); the norms keep their gains.
"""

from __future__ import annotations

import torch
from jaxtyping import Float

from hooked.components.transformer_block import TransformerBlock


class PostNormBlock(TransformerBlock):
    """A `TransformerBlock` whose `ln1`/`ln2` normalize the attention and MLP outputs."""

    def _norm_attn_in(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def _norm_attn_out(self, out: Float[torch.Tensor, "batch pos d_model"]) -> torch.Tensor:
        return self.ln1(out)

    def _norm_mlp_in(self, x: Float[torch.Tensor, "batch pos d_model"]) -> torch.Tensor:
        return x

    def _norm_mlp_out(self, out: Float[torch.Tensor, "batch pos d_model"]) -> torch.Tensor:
        return self.ln2(out)


def block_class(cfg) -> type[TransformerBlock]:
    """The block class of a config: hybrid (a token mixer per `layer_types`), Gemma 3n's (AltUp), Gemma 4's,
    post-norm (OLMo-2/3) or the plain pre-norm one."""
    if cfg.layer_types is not None:
        from hooked.components.hybrid_block import HybridBlock

        return HybridBlock
    if cfg.uses_altup:
        from hooked.components.gemma3n_block import Gemma3nBlock

        return Gemma3nBlock
    if cfg.d_per_layer_input or cfg.layer_scalar:
        from hooked.components.gemma4_block import Gemma4Block

        return Gemma4Block
    return PostNormBlock if cfg.post_sublayer_norm else TransformerBlock
