"""`transformer_lens.components` and its submodules: hooked's components under TransformerLens's names.

Only `CanBeUsedAsMLP` (TransformerLens's MLP base class) is defined here.
"""

from __future__ import annotations

import torch
import torch.nn as nn
from jaxtyping import Float

from hooked.compat.utilities import ActivationFunctionFactory
from hooked.components import (  # noqa: F401
    MLP,
    Attention,
    Embed,
    GatedMLP,
    GroupedQueryAttention,
    LayerNorm,
    LayerNormPre,
    PosEmbed,
    RMSNorm,
    RMSNormPre,
    TransformerBlock,
    Unembed,
    moe,  # noqa: E402
)
from hooked.components.bert import BertBlock, BertEmbed, BertMLMHead, BertNSPHead, BertPooler, TokenTypeEmbed  # noqa: F401
from hooked.components.moe import ClampedSwiGLUExpert, MoE  # noqa: F401
from hooked.core.config import HookedTransformerConfig
from hooked.core.hook_points import HookPoint

AbstractAttention = Attention
__path__: list[str] = []


class CanBeUsedAsMLP(nn.Module):
    """TransformerLens's base of everything usable as a block's MLP (`cfg`, `d_mlp`, `act_fn`)."""

    def __init__(self, cfg: HookedTransformerConfig | dict):
        super().__init__()
        self.cfg = HookedTransformerConfig.unwrap(cfg)
        if self.cfg.d_mlp is None:
            raise ValueError("d_mlp must be set to use an MLP")
        self.d_mlp = self.cfg.d_mlp
        self.hook_mid, self.ln = None, None

    def forward(self, x: Float[torch.Tensor, "batch pos d_model"]) -> Float[torch.Tensor, "batch pos d_model"]:
        return x

    def select_activation_function(self) -> None:
        """Set `act_fn` from `cfg.act_fn`; SoLU-LN also gets `hook_mid` and `ln`."""
        self.act_fn = ActivationFunctionFactory.pick_activation_function(self.cfg)
        if self.cfg.is_layer_norm_activation():
            self.hook_mid = HookPoint()
            self.ln = LayerNorm(self.cfg, self.d_mlp) if self.cfg.normalization_type == "LN" else LayerNormPre(self.cfg)


class GatedMLP4Bit(GatedMLP):
    """TransformerLens's bitsandbytes 4-bit MLP: quantized weights are outside hooked's scope."""

    def __init__(self, cfg: HookedTransformerConfig | dict):
        raise NotImplementedError("4-bit (bitsandbytes) MLPs are not supported: load the model in fp32/bf16")


GPT_OSS_LIMIT = 7.0  # GPT-OSS's `swiglu_limit`: gate clamped above, up clamped to [-limit, limit]
GPT_OSS_ALPHA = 1.702  # the sigmoid's slope in `g * sigmoid(alpha * g)`


class GptOssExpert(ClampedSwiGLUExpert):
    """TransformerLens's GPT-OSS expert: hooked's clamped-SwiGLU expert of width `cfg.d_mlp`."""

    def __init__(self, cfg: HookedTransformerConfig | dict):
        cfg = HookedTransformerConfig.unwrap(cfg)
        super().__init__(cfg.replace(swiglu_limit=cfg.swiglu_limit or GPT_OSS_LIMIT), cfg.mlp_width)


class GptOssMoE(moe.GptOssMoE):
    """TransformerLens's GPT-OSS MoE: hooked's `GptOssMoE` with a biased router, renormalized top-k and
    biased clamped-SwiGLU experts (`swiglu_limit` 7 and `swiglu_alpha` 1.702 unless the config sets them)."""

    def __init__(self, cfg: HookedTransformerConfig | dict):
        cfg = HookedTransformerConfig.unwrap(cfg)
        super().__init__(cfg.replace(swiglu_limit=cfg.swiglu_limit or GPT_OSS_LIMIT, norm_topk_prob=True))


# TransformerLens's T5 components (encoder-decoder)
from hooked.components.t5 import T5Attention, T5Block  # noqa: E402,F401
