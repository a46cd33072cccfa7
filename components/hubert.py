"""HuBERT's pieces: the convolutional feature extractor, the feature projection, the positional
convolution, and its post-LayerNorm encoder block.

A waveform `[batch, samples]` goes through strided 1-D convolutions (`[batch, channels, frames]`),
a LayerNorm + linear projection to `d_model`, then a grouped convolution over time adds a
relative position signal before the transformer blocks. The positional convolution's weight
norm (`g * v / ||v||`) is folded into one plain weight when the checkpoint is converted.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F
from jaxtyping import Float, Int

from hooked.components.activations import get_activation
from hooked.components.forward_state import ForwardState
from hooked.components.mlp import linear
from hooked.components.norms import LayerNorm
from hooked.components.transformer_block import TransformerBlock
from hooked.core.config import HookedTransformerConfig
from hooked.core.hook_points import HookPoint


@dataclass
class AudioFrontendConfig:
    """The HF `HubertConfig` fields of the convolutional front end (names as HF's)."""

    conv_dim: list[int] = field(default_factory=lambda: [512] * 7)
    conv_kernel: list[int] = field(default_factory=lambda: [10, 3, 3, 3, 3, 2, 2])
    conv_stride: list[int] = field(default_factory=lambda: [5, 2, 2, 2, 2, 2, 2])
    conv_bias: bool = False
    feat_extract_norm: str = "group"  # "group": GroupNorm on the first layer; "layer": LayerNorm on each
    feat_extract_activation: str = "gelu"
    feat_proj_layer_norm: bool = True
    num_conv_pos_embeddings: int = 128
    num_conv_pos_embedding_groups: int = 16
    do_stable_layer_norm: bool = False  # pre-LN blocks and a final LayerNorm (HuBERT large)

    def output_lengths(self, lengths: Int[torch.Tensor, "*batch"]) -> Int[torch.Tensor, "*batch"]:
        """Frames produced from `lengths` samples (each convolution has no padding)."""
        for kernel, stride in zip(self.conv_kernel, self.conv_stride, strict=True):
            lengths = torch.div(lengths - kernel, stride, rounding_mode="floor") + 1
        return lengths


def frame_mask(
    sample_mask: Int[torch.Tensor, "batch samples"], n_frames: int, audio: AudioFrontendConfig
) -> torch.Tensor:
    """`[batch, frames]` 1 for frames computed from real samples, as HF's `_get_feature_vector_attention_mask`."""
    lengths = audio.output_lengths(sample_mask.sum(-1)).long()  # [batch]
    return (torch.arange(n_frames, device=sample_mask.device)[None, :] < lengths[:, None]).long()  # [batch, frames]


class ConvLayer(nn.Module):
    """One feature-extractor layer: `Conv1d`, then GroupNorm (one group per channel) or LayerNorm, then GELU."""

    def __init__(self, audio: AudioFrontendConfig, index: int, dtype=torch.float32):
        super().__init__()
        c_in = audio.conv_dim[index - 1] if index > 0 else 1
        c_out = audio.conv_dim[index]
        self.stride = audio.conv_stride[index]
        self.W = nn.Parameter(torch.empty(c_out, c_in, audio.conv_kernel[index], dtype=dtype))
        self.b = nn.Parameter(torch.zeros(c_out, dtype=dtype)) if audio.conv_bias else None
        self.norm = {"group": "group" if index == 0 else None, "layer": "layer"}[audio.feat_extract_norm]
        if self.norm:
            self.norm_w = nn.Parameter(torch.ones(c_out, dtype=dtype))
            self.norm_b = nn.Parameter(torch.zeros(c_out, dtype=dtype))
        self.act_fn = get_activation(audio.feat_extract_activation)
        self.hook_out = HookPoint(pos_axis=2)  # [batch, channels, frames]

    def forward(self, x: Float[torch.Tensor, "batch c_in t_in"]) -> Float[torch.Tensor, "batch c_out frames"]:
        x = F.conv1d(x, self.W, self.b, stride=self.stride)  # [batch, c_out, frames]
        if self.norm == "group":  # each channel normalized over time (nn.GroupNorm's default eps)
            x = F.group_norm(x, x.shape[1], self.norm_w, self.norm_b, eps=1e-5)
        elif self.norm == "layer":  # over channels, at each frame
            x = F.layer_norm(x.transpose(-2, -1), (x.shape[1],), self.norm_w, self.norm_b, eps=1e-5).transpose(-2, -1)
        return self.hook_out(self.act_fn(x))  # [batch, c_out, frames]


class FeatureExtractor(nn.Module):
    """The strided convolutions from samples to frames (a 20 ms hop at 16 kHz for HuBERT base)."""

    def __init__(self, audio: AudioFrontendConfig, dtype=torch.float32):
        super().__init__()
        self.conv_layers = nn.ModuleList([ConvLayer(audio, i, dtype) for i in range(len(audio.conv_dim))])

    def forward(self, waveform: Float[torch.Tensor, "batch samples"]) -> Float[torch.Tensor, "batch channels frames"]:
        x = waveform[:, None]  # [batch, 1, samples]
        for layer in self.conv_layers:
            x = layer(x)
        return x


class FeatureProjection(nn.Module):
    """`[batch, frames, channels]` -> `[batch, frames, d_model]`: optional LayerNorm, then a linear map."""

    def __init__(self, cfg: HookedTransformerConfig, audio: AudioFrontendConfig):
        super().__init__()
        channels = audio.conv_dim[-1]
        self.ln = LayerNorm(cfg, channels) if audio.feat_proj_layer_norm else None
        self.W = nn.Parameter(torch.empty(channels, cfg.d_model, dtype=cfg.dtype))
        self.b = nn.Parameter(torch.zeros(cfg.d_model, dtype=cfg.dtype))

    def forward(
        self, features: Float[torch.Tensor, "batch frames channels"]
    ) -> Float[torch.Tensor, "batch frames d_model"]:
        if self.ln is not None:
            features = self.ln(features)
        return linear(features, self.W, self.b)


class PositionalConv(nn.Module):
    """A grouped convolution over time whose GELU output is added to the frames (the position signal).

    An even kernel is padded by `k // 2` on both sides and the last output frame dropped,
    so each frame keeps its index. `W` is the weight-normed kernel, folded at load.
    """

    def __init__(self, cfg: HookedTransformerConfig, audio: AudioFrontendConfig):
        super().__init__()
        d, k, groups = cfg.d_model, audio.num_conv_pos_embeddings, audio.num_conv_pos_embedding_groups
        self.kernel, self.groups = k, groups
        self.W = nn.Parameter(torch.empty(d, d // groups, k, dtype=cfg.dtype))
        self.b = nn.Parameter(torch.zeros(d, dtype=cfg.dtype))
        self.act_fn = get_activation(audio.feat_extract_activation)

    def forward(
        self, frames: Float[torch.Tensor, "batch frames d_model"]
    ) -> Float[torch.Tensor, "batch frames d_model"]:
        x = F.conv1d(frames.transpose(1, 2), self.W, self.b, padding=self.kernel // 2, groups=self.groups)
        if self.kernel % 2 == 0:
            x = x[:, :, :-1]  # [batch, d_model, frames]
        return self.act_fn(x).transpose(1, 2)  # [batch, frames, d_model]


class HubertBlock(TransformerBlock):
    """HuBERT's encoder block: post-LayerNorm (as BERT) or, with `stable_layer_norm`, pre-LayerNorm.

    Post-LN, with TransformerLens's `BertBlock` hook names:
    `resid_mid = resid_pre + attn`, `n = ln1(resid_mid)`, `resid_post = n + mlp(n)`,
    output `hook_normalized_resid_post = ln2(resid_post)`.
    """

    def __init__(self, cfg: HookedTransformerConfig, layer: int, stable_layer_norm: bool = False):
        super().__init__(cfg, layer)
        self.stable_layer_norm = stable_layer_norm
        if not stable_layer_norm:
            self.hook_normalized_resid_post = HookPoint()  # [batch, pos, d_model]

    def forward(
        self,
        resid_pre: Float[torch.Tensor, "batch pos d_model"],
        state: ForwardState | Float[torch.Tensor, "batch 1 1 pos"] | None = None,
        *,
        attention_mask: Int[torch.Tensor, "batch pos"] | None = None,
    ) -> Float[torch.Tensor, "batch pos d_model"]:
        """One block; `state` is the model's, or (TransformerLens-style) an additive mask `[batch, 1, 1, pos]`."""
        if not isinstance(state, ForwardState):
            if state is not None and attention_mask is None:  # TL's additive mask: 0 keep, -inf drop
                attention_mask = (state[:, 0, 0, :] == 0).long()
            state = ForwardState.for_input(
                resid_pre.shape[0], resid_pre.shape[1], resid_pre.device, attention_mask, causal=False
            )
        if self.stable_layer_norm:
            return super().forward(resid_pre, state)
        resid_pre = self.hook_resid_pre(resid_pre)  # [batch, pos, d_model]
        q_in = k_in = v_in = resid_pre
        if self.cfg.use_split_qkv_input:
            H = self.cfg.n_heads
            q_in, k_in, v_in = (
                hook(resid_pre.unsqueeze(2).repeat(1, 1, H, 1))
                for hook in (self.hook_q_input, self.hook_k_input, self.hook_v_input)
            )  # [batch, pos, head, d_model]
        attn_out = self.hook_attn_out(self.attn(q_in, k_in, v_in, state))  # [batch, pos, d_model]
        resid_mid = self.hook_resid_mid(resid_pre + attn_out)  # [batch, pos, d_model]
        mlp_in = self.hook_mlp_in(resid_mid.clone()) if self.cfg.use_hook_mlp_in else resid_mid
        normalized = self.ln1(mlp_in)
        mlp_out = self.hook_mlp_out(self.mlp(normalized))  # [batch, pos, d_model]
        resid_post = self.hook_resid_post(normalized + mlp_out)  # [batch, pos, d_model]
        return self.hook_normalized_resid_post(self.ln2(resid_post))  # [batch, pos, d_model]
