"""The building blocks of a hooked transformer: embeddings, norms, attention, MLPs and blocks.

Each module computes exactly what its HuggingFace counterpart computes, with a
`HookPoint` on every intermediate activation.
"""

from components.attention import Attention, GroupedQueryAttention
from components.embed import Embed, PosEmbed
from components.forward_state import ForwardState
from components.mlp import MLP, GatedMLP
from components.norms import LayerNorm, LayerNormPre, RMSNorm, RMSNormPre
from components.transformer_block import TransformerBlock
from components.unembed import Unembed

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
