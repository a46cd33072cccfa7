"""The building blocks of a hooked transformer: embeddings, norms, attention, MLPs and blocks.

Each module computes exactly what its HuggingFace counterpart computes, with a
`HookPoint` on every intermediate activation.
"""

from hooked.components.attention import Attention, GroupedQueryAttention
from hooked.components.embed import Embed, PosEmbed
from hooked.components.forward_state import ForwardState
from hooked.components.mlp import MLP, GatedMLP
from hooked.components.norms import LayerNorm, LayerNormPre, RMSNorm, RMSNormPre
from hooked.components.transformer_block import TransformerBlock
from hooked.components.unembed import Unembed

__all__ = [
    "Attention",
    "Embed",
    "ForwardState",
    "GatedMLP",
    "GroupedQueryAttention",
    "LayerNorm",
    "LayerNormPre",
    "MLP",
    "PosEmbed",
    "RMSNorm",
    "RMSNormPre",
    "TransformerBlock",
    "Unembed",
]
