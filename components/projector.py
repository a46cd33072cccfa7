"""Projectors: the vision tower's features into the language model's residual stream.

LLaVA's is a two-layer MLP applied to every patch (`MLPProjector`); Gemma 3's averages the
patches over square windows, normalizes them (RMSNorm with gain `1 + w`) and applies one matrix
(`PoolingProjector`), so 4096 patches become 256 image tokens; Qwen2.5-VL's makes each 2 x 2 square
of patches one token (`PatchMerger`). All end at `hook_out` (`[images, tokens, d_model]`, Qwen2.5-VL's
`[tokens, d_model]`), the features before they are laid out among the text tokens.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from jaxtyping import Float

from hooked.components.activations import get_activation
from hooked.components.mlp import linear
from hooked.components.norms import RMSNorm, RMSNormGainFirst
from hooked.core.config import HookedTransformerConfig
from hooked.core.hook_points import HookPoint
from hooked.core.validation import require_set
from hooked.core.vision_config import VisionLanguageConfig


class MLPProjector(nn.Module):
    """`act(x W_in + b_in) W_out + b_out`: `W_in` `[d_features, d_model]`, `W_out` `[d_model, d_model]`.

    LLaVA-NeXT/OneVision also learn `image_newline` `[d_model]`, the token that ends each row of image tokens.
    """

    def __init__(self, cfg: HookedTransformerConfig, vcfg: VisionLanguageConfig):
        super().__init__()
        d_in, d, dt = vcfg.d_features, cfg.d_model, cfg.dtype
        self.W_in = nn.Parameter(torch.empty(d_in, d, dtype=dt))
        self.b_in = nn.Parameter(torch.zeros(d, dtype=dt))
        self.W_out = nn.Parameter(torch.empty(d, d, dtype=dt))
        self.b_out = nn.Parameter(torch.zeros(d, dtype=dt))
        if vcfg.image_newline:
            self.image_newline = nn.Parameter(torch.zeros(d, dtype=dt))
        self.act_fn = get_activation(require_set(vcfg.projector_act, "projector_act"))
        self.hook_pre = HookPoint()  # [images, tokens, d_model]
        self.hook_post = HookPoint()  # [images, tokens, d_model]
        self.hook_out = HookPoint()  # [images, tokens, d_model]

    def forward(
        self, features: Float[torch.Tensor, "images tokens d_features"]
    ) -> Float[torch.Tensor, "images tokens d_model"]:
        pre = self.hook_pre(linear(features, self.W_in, self.b_in))  # [images, tokens, d_model]
        post = self.hook_post(self.act_fn(pre))
        return self.hook_out(linear(post, self.W_out, self.b_out))


class PoolingProjector(nn.Module):
    """Gemma 3: average each `kernel x kernel` window of patches, RMSNorm (`norm`), then `W` `[d_vision, d_model]`."""

    def __init__(self, cfg: HookedTransformerConfig, vcfg: VisionLanguageConfig):
        super().__init__()
        self.side = vcfg.patches_per_side
        self.kernel = vcfg.patches_per_side // vcfg.tokens_per_side
        # Gemma's RMSNorm: gain `1 + w` applied in float32 (`w` holds the sum, as the text model's norms)
        norm_cfg = vcfg.vision.replace(eps=vcfg.projector_eps, norm_gain_offset=1.0, normalization_type="RMS")
        self.norm = RMSNormGainFirst(norm_cfg, vcfg.vision.d_model)
        self.W = nn.Parameter(torch.empty(vcfg.vision.d_model, cfg.d_model, dtype=cfg.dtype))
        self.hook_pooled = HookPoint()  # [images, tokens, d_vision]
        self.hook_out = HookPoint()  # [images, tokens, d_model]

    def forward(
        self, features: Float[torch.Tensor, "images patches d_vision"]
    ) -> Float[torch.Tensor, "images tokens d_model"]:
        images, _, d_vision = features.shape
        grid = features.transpose(1, 2).reshape(images, d_vision, self.side, self.side)  # [images, d, side, side]
        pooled = F.avg_pool2d(grid.contiguous(), kernel_size=self.kernel, stride=self.kernel)  # [images, d, s, s]
        pooled = self.hook_pooled(pooled.flatten(2).transpose(1, 2))  # [images, tokens, d_vision]
        return self.hook_out(torch.matmul(self.norm(pooled), self.W).type_as(features))  # [images, tokens, d_model]


class PatchMerger(nn.Module):
    """Qwen2.5-VL: RMSNorm each patch (`norm`), concatenate each `merge x merge` square, then
    `gelu(x W_in + b_in) W_out + b_out` into one image token (`W_in` `[4 d_vision, 4 d_vision]`)."""

    def __init__(self, cfg: HookedTransformerConfig, vcfg: VisionLanguageConfig):
        super().__init__()
        d_in, dt = vcfg.vision.d_model * vcfg.spatial_merge_size**2, cfg.dtype
        self.norm = RMSNorm(vcfg.vision.replace(eps=vcfg.projector_eps, normalization_type="RMS"), vcfg.vision.d_model)
        self.W_in = nn.Parameter(torch.empty(d_in, d_in, dtype=dt))
        self.b_in = nn.Parameter(torch.zeros(d_in, dtype=dt))
        self.W_out = nn.Parameter(torch.empty(d_in, cfg.d_model, dtype=dt))
        self.b_out = nn.Parameter(torch.zeros(cfg.d_model, dtype=dt))
        self.act_fn = get_activation(require_set(vcfg.projector_act, "projector_act"))
        self.hook_pre = HookPoint()  # [tokens, merge² d_vision]
        self.hook_post = HookPoint()  # [tokens, merge² d_vision]
        self.hook_out = HookPoint()  # [tokens, d_model]

    def forward(self, features: Float[torch.Tensor, "patches d_vision"]) -> Float[torch.Tensor, "tokens d_model"]:
        squares = self.norm(features).view(-1, self.W_in.shape[0])  # [tokens, merge² d_vision]
        pre = self.hook_pre(linear(squares, self.W_in, self.b_in))
        return self.hook_out(linear(self.hook_post(self.act_fn(pre)), self.W_out, self.b_out))
