"""Weight views and initialisation shared by the encoder model classes (T5, HuBERT).

`W_Q` ... `b_out` stack one parameter over every block `blocks_for_weights()` yields
(T5: the encoder's blocks, then the decoder's), as TransformerLens's encoder classes do.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.nn as nn
from jaxtyping import Float

from hooked.core.config import HookedTransformerConfig
from hooked.core.factored_matrix import FactoredMatrix

# the host classes are modules: the type checker sees nn.Module's methods, the runtime MRO is unchanged
if TYPE_CHECKING:
    _ModuleBase = nn.Module
else:
    _ModuleBase = object


def _stacked(module: str, name: str):
    def get(self) -> torch.Tensor:
        return torch.stack([getattr(getattr(block, module), name) for block in self.blocks_for_weights()], dim=0)

    get.__doc__ = f"`{module}.{name}` of every block, stacked on a new first axis (layers)."
    return property(get)


class StackedWeightsMixin(_ModuleBase):
    """Mixin: TransformerLens's stacked weight properties, `QK`/`OV`, and a plain weight init."""

    # set by the host class; the embedding and unembedding differ per architecture
    cfg: HookedTransformerConfig
    blocks: nn.ModuleList
    embed: Any
    unembed: Any

    W_Q = _stacked("attn", "W_Q")
    W_K = _stacked("attn", "W_K")
    W_V = _stacked("attn", "W_V")
    W_O = _stacked("attn", "W_O")
    b_Q = _stacked("attn", "b_Q")
    b_K = _stacked("attn", "b_K")
    b_V = _stacked("attn", "b_V")
    b_O = _stacked("attn", "b_O")
    W_in = _stacked("mlp", "W_in")
    W_out = _stacked("mlp", "W_out")
    b_in = _stacked("mlp", "b_in")
    b_out = _stacked("mlp", "b_out")

    def blocks_for_weights(self):
        return iter(self.blocks)

    @property
    def QK(self) -> FactoredMatrix:  # [n_layers, n_heads, d_model, d_model]
        return FactoredMatrix(self.W_Q, self.W_K.transpose(-2, -1))

    @property
    def OV(self) -> FactoredMatrix:  # [n_layers, n_heads, d_model, d_model]
        return FactoredMatrix(self.W_V, self.W_O)

    @property
    def W_U(self) -> Float[torch.Tensor, "d_model d_vocab"]:
        return self.unembed.W_U

    @property
    def b_U(self) -> Float[torch.Tensor, "d_vocab"]:
        return self.unembed.b_U

    @property
    def W_E(self) -> Float[torch.Tensor, "d_vocab d_model"]:
        return self.embed.W_E

    def init_weights(self) -> None:
        """Matrices and embeddings ~ N(0, initializer_range (0.02 if unset)), biases 0, norm gains 1."""
        if self.cfg.seed is not None:
            torch.manual_seed(self.cfg.seed)
        std = self.cfg.initializer_range if self.cfg.initializer_range > 0 else 0.02
        for name, p in self.named_parameters():
            leaf = name.rsplit(".", 1)[-1]
            if leaf in ("w", "norm_w") or (leaf == "weight" and "norm" in name):
                nn.init.ones_(p)
            elif leaf.startswith("W_") or leaf == "weight" or p.ndim > 1:
                nn.init.normal_(p, std=std)
            else:
                nn.init.zeros_(p)


StackedWeights = StackedWeightsMixin  # its name before the mixins were named one way
