"""The vision tower of an image-text model: a ViT (CLIP's or SigLIP's) with a hook on every activation.

A ViT reads an image as a sequence: a strided convolution turns each `patch_size`² patch into
one d_model vector (`PatchEmbed`), CLIP puts a learned class embedding in front, a learned
position embedding is added, and pre-norm transformer blocks mix the positions. The blocks are
`hooked.components.TransformerBlock` with bidirectional attention (every patch sees every
patch) and LayerNorm: the math of CLIP's and SigLIP's encoder layers. Their hooks are named as
the text model's, under `vision.` (`vision.blocks.3.attn.hook_pattern` is
`[images, head, patch_q, patch_k]`).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from jaxtyping import Float

from hooked.components.forward_state import ForwardState
from hooked.components.norms import LayerNorm
from hooked.components.transformer_block import TransformerBlock
from hooked.core.errors import InputError
from hooked.core.hook_points import HookPoint
from hooked.core.vision_config import VisionLanguageConfig


class PatchEmbed(nn.Module):
    """Patches to vectors: `W_patch` `[d_model, channels, patch, patch]` applied with stride `patch`.

    `W_pos` `[positions, d_model]` holds one learned vector per position (the class token's first,
    with CLIP); `class_embed` `[d_model]` is CLIP's class token.
    """

    def __init__(self, vcfg: VisionLanguageConfig):
        super().__init__()
        cfg, p = vcfg.vision, vcfg.patch_size
        self.patch_size, self.image_size = p, vcfg.image_size
        self.W_patch = nn.Parameter(torch.empty(cfg.d_model, vcfg.num_channels, p, p, dtype=cfg.dtype))
        self.b_patch = nn.Parameter(torch.zeros(cfg.d_model, dtype=cfg.dtype)) if vcfg.patch_bias else None
        if vcfg.class_token:
            self.class_embed = nn.Parameter(torch.zeros(cfg.d_model, dtype=cfg.dtype))
        self.W_pos = nn.Parameter(torch.empty(vcfg.n_vision_positions, cfg.d_model, dtype=cfg.dtype))
        self.hook_patch_embed = HookPoint()  # [images, patches, d_model]
        self.hook_pos_embed = HookPoint()  # [images, positions, d_model]

    def forward(
        self, pixel_values: Float[torch.Tensor, "images channels height width"]
    ) -> Float[torch.Tensor, "images positions d_model"]:
        """Each image's positions: (class token,) patches in row-major order, plus their position embeddings."""
        height, width = pixel_values.shape[-2:]
        if height != self.image_size or width != self.image_size:
            raise InputError(
                f"pixel_values are {height}x{width} pixels; this vision tower reads {self.image_size}x"
                f"{self.image_size} images: preprocess them with the checkpoint's processor (model.prepare_inputs)"
            )
        pixels = pixel_values.to(self.W_patch.dtype)
        patches = F.conv2d(pixels, self.W_patch, self.b_patch, stride=self.patch_size)  # [images, d, rows, cols]
        patches = self.hook_patch_embed(patches.flatten(2).transpose(1, 2))  # [images, patches, d_model]
        if hasattr(self, "class_embed"):
            cls = self.class_embed.expand(patches.shape[0], 1, -1)  # [images, 1, d_model]
            patches = torch.cat([cls, patches], dim=1)  # [images, positions, d_model]
        pos = self.hook_pos_embed(self.W_pos.expand(patches.shape[0], -1, -1))  # [images, positions, d_model]
        return patches + pos


class VisionTower(nn.Module):
    """The ViT: `embed` (patches and positions), `ln_pre` (CLIP), `blocks`, `ln_post` (when the features use it).

    `forward` returns the hidden states at `feature_layers` concatenated along d_model, the class
    token dropped if asked: what the projector reads (`hook_features`).
    """

    def __init__(self, vcfg: VisionLanguageConfig):
        super().__init__()
        self.vcfg, cfg = vcfg, vcfg.vision
        self.embed = PatchEmbed(vcfg)
        self.hook_embed = HookPoint()  # [images, positions, d_model]
        if vcfg.pre_norm:
            self.ln_pre = LayerNorm(cfg)
        self.blocks = nn.ModuleList([TransformerBlock(cfg, layer) for layer in range(cfg.n_layers)])
        if vcfg.post_norm:
            self.ln_post = LayerNorm(cfg)
        self.hook_features = HookPoint()  # [images, tokens, d_model * len(feature_layers)]

    def forward(
        self, pixel_values: Float[torch.Tensor, "images channels height width"]
    ) -> Float[torch.Tensor, "images tokens d_features"]:
        residual = self.hook_embed(self.embed(pixel_values))  # [images, positions, d_model]
        if hasattr(self, "ln_pre"):
            residual = self.ln_pre(residual)
        images, n_pos = residual.shape[:2]
        state = ForwardState.for_input(images, n_pos, residual.device, causal=False)
        wanted = self.vcfg.feature_layers
        hidden = {0: residual} if 0 in wanted else {}
        for layer, block in enumerate(self.blocks):
            residual = block(residual, state)
            if layer + 1 in wanted:
                hidden[layer + 1] = residual
        if hasattr(self, "ln_post"):  # only the last hidden state is normalized (HF's `last_hidden_state`)
            last = len(self.blocks)
            hidden[last] = self.ln_post(hidden[last])
        parts = [hidden[i] for i in wanted]
        features = parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)  # [images, positions, d_features]
        if self.vcfg.drop_class_token:
            features = features[:, 1:]  # [images, patches, d_features]
        return self.hook_features(features)
