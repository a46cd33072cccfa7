"""`HookedAudioEncoder`: HuBERT with a `HookPoint` on every activation, front end included.

TransformerLens 2.18 runs HuBERT's convolutional front end and positional convolution
inside a wrapped HF model and hooks only the transformer blocks; here every piece is
native, so `feature_extractor.conv_layers.{i}.hook_out`, `hook_features`, `hook_frames`
and `hook_pos_embed` can be read and patched too. Block names follow TransformerLens
(`blocks.{l}.attn.hook_pattern`, `blocks.{l}.hook_normalized_resid_post`, ...).
"""

from __future__ import annotations

import json
import logging
from typing import Any

import torch
import torch.nn as nn
from jaxtyping import Float, Int

from hooked.analysis.activation_cache import ActivationCache  # noqa: F401  (TransformerLens imports it from this module)
from hooked.components.forward_state import ForwardState
from hooked.components.hubert import (
    AudioFrontendConfig,
    FeatureExtractor,
    FeatureProjection,
    HubertBlock,
    PositionalConv,
    frame_mask,
)
from hooked.components.norms import LayerNorm
from hooked.core.config import HookedTransformerConfig
from hooked.core.hook_points import HookedRootModule, HookPoint  # noqa: F401  (TransformerLens imports it from this module)
from hooked.models.hooked_model import HookedModel
from hooked.models.stacked_weights_mixin import StackedWeights, StackedWeightsMixin  # noqa: F401  (StackedWeights: importable from here before)

logger = logging.getLogger(__name__)


class HookedAudioEncoder(StackedWeightsMixin, HookedModel):
    """HuBERT (`HubertModel`): waveform `[batch, samples]` -> hidden states `[batch, frames, d_model]`.

    Built from a config alone (`audio_cfg=None`, as TransformerLens's constructor) it has only
    the transformer and takes projected frames `[batch, frames, d_model]`.
    """

    def __init__(
        self,
        cfg: HookedTransformerConfig | dict,
        move_to_device: bool = True,
        audio_cfg: AudioFrontendConfig | dict | None = None,
        **kwargs: Any,
    ):
        super().__init__()
        if isinstance(cfg, str):
            raise ValueError("Pass a config; to load a checkpoint use HookedAudioEncoder.from_pretrained(name)")
        self.cfg = cfg = HookedTransformerConfig.unwrap(cfg)
        if cfg.n_devices != 1:
            raise ValueError("HookedAudioEncoder runs on one device (n_devices=1)")
        self.audio_cfg = AudioFrontendConfig(**audio_cfg) if isinstance(audio_cfg, dict) else audio_cfg
        self.stable_layer_norm = bool(self.audio_cfg and self.audio_cfg.do_stable_layer_norm)
        if self.audio_cfg is not None:
            self.feature_extractor = FeatureExtractor(self.audio_cfg, cfg.dtype)
            self.feature_projection = FeatureProjection(cfg, self.audio_cfg)
            self.pos_conv_embed = PositionalConv(cfg, self.audio_cfg)
        self.encoder_ln = LayerNorm(cfg)
        self.blocks = nn.ModuleList([HubertBlock(cfg, layer, self.stable_layer_norm) for layer in range(cfg.n_layers)])
        self.hook_features = HookPoint()  # [batch, frames, channels]
        self.hook_frames = HookPoint()  # [batch, frames, d_model]
        self.hook_pos_embed = HookPoint()  # [batch, frames, d_model]
        self.processor = None
        # zero-mean unit-variance per waveform, as the checkpoint's HF feature extractor (do_normalize)
        self.normalize_waveforms = False
        if cfg.init_weights:
            self.init_weights()
        if move_to_device and cfg.device is not None:
            self.to(cfg.device)
        self.setup()

    @property
    def device(self) -> torch.device:
        return self.encoder_ln.w.device

    def _front_end(self):
        if self.audio_cfg is None:
            raise ValueError(
                "This HookedAudioEncoder has no convolutional front end (built without audio_cfg): pass projected "
                "frames [batch, frames, d_model], or load a checkpoint with from_pretrained"
            )
        return self.audio_cfg

    def to_frames(
        self,
        raw_inputs: torch.Tensor | list | tuple,
        sampling_rate: int = 16000,
        move_to_device: bool = True,
        one_zero_attention_mask: Int[torch.Tensor, "batch samples"] | None = None,
    ) -> tuple[Float[torch.Tensor, "batch frames d_model"], Int[torch.Tensor, "batch frames"] | None]:
        """Waveforms -> projected frames and their mask (None when nothing is padded).

        `raw_inputs`: `[samples]`, `[batch, samples]` or a list of 1-D waveforms (right-padded
        with zeros here). If the checkpoint's feature extractor normalizes (`do_normalize`),
        each waveform is normalized over its real samples first (`normalize_waveforms`).
        """
        audio = self._front_end()
        _check_sampling_rate(sampling_rate)
        waves, mask = _batch_waveforms(raw_inputs, one_zero_attention_mask)
        waves = waves.to(self.device, self.cfg.dtype)
        if self.normalize_waveforms:
            waves = normalize_waveforms(waves, None if mask is None else mask.to(self.device))
        features = self.feature_extractor(waves).transpose(1, 2)  # [batch, frames, channels]
        features = self.hook_features(features)
        frames = self.hook_frames(self.feature_projection(features))  # [batch, frames, d_model]
        if mask is not None:
            mask = frame_mask(mask.to(self.device), frames.shape[1], audio)  # [batch, frames]
        return frames, mask

    def encoder_output(
        self,
        frames: Float[torch.Tensor, "batch frames d_model"],
        one_zero_attention_mask: Int[torch.Tensor, "batch frames"] | None = None,
    ) -> Float[torch.Tensor, "batch frames d_model"]:
        """The transformer on projected frames: positional convolution, LayerNorm, blocks."""
        self._front_end()
        frames = frames.to(self.device)
        mask = None if one_zero_attention_mask is None else one_zero_attention_mask.to(self.device)
        if mask is not None:  # padded frames are zeroed before the positional convolution, as HF
            frames = torch.where(
                mask.bool()[..., None], frames, torch.zeros((), dtype=frames.dtype, device=frames.device)
            )
        resid = frames + self.hook_pos_embed(self.pos_conv_embed(frames))  # [batch, frames, d_model]
        if not self.stable_layer_norm:
            resid = self.encoder_ln(resid)
        state = ForwardState.for_input(resid.shape[0], resid.shape[1], resid.device, mask, causal=False)
        for block in self.blocks:
            resid = block(resid, state)
        return self.encoder_ln(resid) if self.stable_layer_norm else resid

    def forward(
        self,
        inputs: torch.Tensor | list | tuple,
        one_zero_attention_mask: Int[torch.Tensor, "batch pos"] | None = None,
        sampling_rate: int = 16000,
        move_to_device: bool = True,
    ) -> Float[torch.Tensor, "batch frames d_model"]:
        """Hidden states of the last layer.

        `inputs`: waveforms (`[samples]`, `[batch, samples]`, or a list), with an optional
        sample-level `one_zero_attention_mask`; or projected frames `[batch, frames, d_model]`
        (mask over frames); or a `(frames, frame_mask)` tuple. `sampling_rate` must be the
        model's (16 kHz); no resampling is done.
        """
        _check_sampling_rate(sampling_rate)
        if isinstance(inputs, tuple) and len(inputs) == 2 and isinstance(inputs[0], torch.Tensor):
            frames, mask = inputs
            mask = mask if one_zero_attention_mask is None else one_zero_attention_mask
        elif isinstance(inputs, torch.Tensor) and inputs.ndim == 3:
            frames, mask = inputs, one_zero_attention_mask
        else:
            frames, mask = self.to_frames(inputs, one_zero_attention_mask=one_zero_attention_mask)
        return self.encoder_output(frames, mask)

    def all_head_labels(self) -> list[str]:
        return [f"L{layer}H{h}" for layer in range(self.cfg.n_layers) for h in range(self.cfg.n_heads)]

    @classmethod
    def from_pretrained(
        cls,
        model_name: str,
        checkpoint_index=None,
        checkpoint_value=None,
        hf_model=None,
        device: str | None = None,
        move_to_device: bool = True,
        dtype=torch.float32,
        **from_pretrained_kwargs: Any,
    ) -> HookedAudioEncoder:
        """Load a `HubertModel` checkpoint (a local directory, a hub name cached offline, or `hf_model=`)."""
        from hooked.loading.encoder_checkpoints import checkpoint_directory, checkpoint_source, finish_loading
        from hooked.loading.hubert import HUBERT, convert_hubert_weights, hubert_frontend_config

        if checkpoint_index is not None or checkpoint_value is not None:
            raise ValueError("HuBERT has no training checkpoints to choose from")
        cfg, source = checkpoint_source(HUBERT, model_name, hf_model, dtype, device, **from_pretrained_kwargs)
        model = cls(cfg, move_to_device=False, audio_cfg=hubert_frontend_config(source.hf_config))
        state = convert_hubert_weights(source.state, cfg, source.hf_config)
        directory = None if hf_model is not None else checkpoint_directory(model_name, **from_pretrained_kwargs)
        preprocessor = directory / "preprocessor_config.json" if directory is not None else None
        if preprocessor is not None and preprocessor.exists():
            model.normalize_waveforms = bool(json.loads(preprocessor.read_text()).get("do_normalize", False))
        return finish_loading(model, state, device, move_to_device, model_name)


def _batch_waveforms(raw_inputs, mask) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`[batch, samples]` waveforms and a sample mask (None if nothing is padded)."""
    if isinstance(raw_inputs, (list, tuple)):
        waves = [torch.as_tensor(w, dtype=torch.float32).reshape(-1) for w in raw_inputs]
        n = max(len(w) for w in waves)
        batch = torch.zeros(len(waves), n)
        padded = torch.zeros(len(waves), n, dtype=torch.long)
        for i, w in enumerate(waves):
            batch[i, : len(w)], padded[i, : len(w)] = w, 1
        return batch, padded if mask is None and not bool(padded.all()) else mask
    waves = torch.as_tensor(raw_inputs)
    if waves.ndim == 1:
        waves = waves[None]  # [1, samples]
    if waves.ndim != 2:
        raise ValueError(f"Waveforms must be [samples] or [batch, samples], got shape {tuple(waves.shape)}")
    return waves, mask


def _check_sampling_rate(sampling_rate: int) -> None:
    if sampling_rate != 16000:
        raise ValueError(f"HuBERT expects 16 kHz audio; resample the {sampling_rate} Hz input first")


def normalize_waveforms(
    waves: Float[torch.Tensor, "batch samples"], mask: Int[torch.Tensor, "batch samples"] | None = None
) -> Float[torch.Tensor, "batch samples"]:
    """`(x - mean) / sqrt(var + 1e-7)` per waveform over its real samples, padding kept 0 (HF's `do_normalize`)."""
    if mask is None:
        mean, var = waves.mean(-1, keepdim=True), waves.var(-1, unbiased=False, keepdim=True)
        return (waves - mean) / torch.sqrt(var + 1e-7)
    out = torch.zeros_like(waves)
    for i, n in enumerate(mask.sum(-1).tolist()):
        x = waves[i, :n]
        out[i, :n] = (x - x.mean()) / torch.sqrt(x.var(unbiased=False) + 1e-7)
    return out
