"""AltUp (alternating updates, Gemma 3n): a residual stream `n` times wider than the blocks that update it.

The stream is `[batch, pos, stream, d_model]` with `n = cfg.altup_num_inputs` streams. Each block
(`Gemma3nBlock`) updates one of them, the active stream `cfg.altup_active_idx`, with its sublayers,
and moves the others with two small learned maps, both driven by `modalities`, `tanh` of a router
reading the (RMS-normalized, `1/d_model`-scaled) active stream:

- **predict**, before the sublayers: `pred_j = x_j + sum_i coef_ij x_i`, coefficients from the
  modalities of the active stream (`prediction_coefs`, `n` -> `n^2`);
- **correct**, after them: `corrected_j = pred_j + (1 + c_j) (y - pred_active)`, with `y` the active
  stream after the sublayers and `c` from its modalities (`correction_coefs`, `n` -> `n`).

Around the blocks, `AltUpStreams` turns the embedding into `n` streams (stream 0 the embedding,
stream i its projection by `W_up[i - 1]` rescaled to the embedding's root mean square) and, before
`ln_final`, back into one (each stream i > 0 projected by `W_down[i - 1]`, rescaled to stream 0's
root mean square, then the mean of the `n`).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from jaxtyping import Float

from hooked.components.norms import make_norm
from hooked.core.config import HookedTransformerConfig
from hooked.core.hook_points import HookPoint
from hooked.core.validation import require_set


def match_magnitude(
    x: Float[torch.Tensor, "batch pos d_model"], target: Float[torch.Tensor, "batch pos 1"]
) -> Float[torch.Tensor, "batch pos d_model"]:
    """`x` rescaled to the root mean square `target` (its own root mean square clamped at sqrt(1e-5)), as HF."""
    magnitude = torch.sqrt(torch.mean(x**2, dim=-1, keepdim=True).clamp(min=1e-5))  # [batch, pos, 1]
    return x * target / magnitude


class AltUpStreams(nn.Module):
    """The model's way into and out of the streams: `expand` after the embedding, `collapse` before `ln_final`."""

    def __init__(self, cfg: HookedTransformerConfig):
        super().__init__()
        extra, d = require_set(cfg.altup_num_inputs, "altup_num_inputs") - 1, cfg.d_model
        self.W_up = nn.Parameter(torch.empty(extra, d, d, dtype=cfg.dtype))  # [stream - 1, d_model, d_model]
        self.W_down = nn.Parameter(torch.empty(extra, d, d, dtype=cfg.dtype))  # [stream - 1, d_model, d_model]
        self.hook_expanded = HookPoint()  # [batch, pos, stream, d_model]: the streams entering block 0
        self.hook_collapsing = HookPoint()  # [batch, pos, stream, d_model]: rescaled, before their mean

    def expand(
        self, embed: Float[torch.Tensor, "batch pos d_model"]
    ) -> Float[torch.Tensor, "batch pos stream d_model"]:
        target = torch.mean(embed**2, dim=-1, keepdim=True) ** 0.5  # [batch, pos, 1]
        streams = [embed] + [match_magnitude(F.linear(embed, W.t()), target) for W in self.W_up]
        return self.hook_expanded(torch.stack(streams, dim=2))  # [batch, pos, stream, d_model]

    def collapse(
        self, resid: Float[torch.Tensor, "batch pos stream d_model"]
    ) -> Float[torch.Tensor, "batch pos d_model"]:
        first = resid[:, :, 0]  # [batch, pos, d_model]
        target = torch.mean(first**2, dim=-1, keepdim=True) ** 0.5  # [batch, pos, 1]
        # each stream contiguous, as HF's `[stream, batch, pos, d]` slices: float16 matmuls round by layout
        streams_in = [resid[:, :, i + 1].contiguous() for i in range(len(self.W_down))]
        rest = [match_magnitude(F.linear(x, W.t()), target) for x, W in zip(streams_in, self.W_down, strict=True)]
        stacked = torch.stack([first, *rest], dim=0)  # [stream, batch, pos, d_model], HF's layout
        streams = self.hook_collapsing(stacked.permute(1, 2, 0, 3))  # [batch, pos, stream, d_model]
        # the mean over HF's leading stream axis: a mean over the middle axis rounds otherwise in float16
        return streams.permute(2, 0, 1, 3).mean(dim=0)  # [batch, pos, d_model]


class AltUp(nn.Module):
    """One block's predict and correct steps (module docstring); `blocks.{l}.altup`."""

    def __init__(self, cfg: HookedTransformerConfig):
        super().__init__()
        n, d = require_set(cfg.altup_num_inputs, "altup_num_inputs"), cfg.d_model
        self.active = cfg.altup_active_idx
        self.W_router = nn.Parameter(torch.empty(d, n, dtype=cfg.dtype))  # [d_model, stream]
        self.router_norm = make_norm(cfg, "RMS")  # its own gain: never folded
        self.W_prediction = nn.Parameter(torch.empty(n, n * n, dtype=cfg.dtype))  # [stream, stream * stream]
        self.W_correction = nn.Parameter(torch.empty(n, n, dtype=cfg.dtype))  # [stream, stream]
        self.correct_output_scale = nn.Parameter(torch.zeros(d, dtype=cfg.dtype))  # [d_model]
        self.router_input_scale = 1.0 / d
        self.hook_modalities = HookPoint()  # [batch, pos, stream]: tanh of the router (predict, then correct)
        self.hook_predictions = HookPoint()  # [batch, pos, stream, d_model]
        self.hook_innovation = HookPoint()  # [batch, pos, d_model]: the sublayers' update of the active stream
        self.hook_corrected = HookPoint()  # [batch, pos, stream, d_model]

    def modalities(self, x: Float[torch.Tensor, "batch pos d_model"]) -> Float[torch.Tensor, "batch pos stream"]:
        routed = F.linear(self.router_norm(x) * self.router_input_scale, self.W_router.t())  # [batch, pos, stream]
        return self.hook_modalities(torch.tanh(routed.float()).type_as(x))

    def predict(self, resid: Float[torch.Tensor, "batch pos stream d_model"]) -> torch.Tensor:
        n = resid.shape[2]
        modalities = self.modalities(resid[:, :, self.active])  # [batch, pos, stream]
        raw = F.linear(modalities, self.W_prediction.t())  # [batch, pos, stream * stream]
        coefs = raw.reshape(*raw.shape[:-1], n, n).transpose(-1, -2)  # [batch, pos, stream_in, stream_out]
        mixed = torch.matmul(resid.transpose(-1, -2), coefs).transpose(-1, -2)  # [batch, pos, stream, d_model]
        return self.hook_predictions((mixed + resid).type_as(resid))

    def correct(
        self,
        predictions: Float[torch.Tensor, "batch pos stream d_model"],
        activated: Float[torch.Tensor, "batch pos d_model"],
    ) -> Float[torch.Tensor, "batch pos stream d_model"]:
        modalities = self.modalities(activated)  # [batch, pos, stream]
        innovation = self.hook_innovation(activated - predictions[:, :, self.active])  # [batch, pos, d_model]
        coefs = F.linear(modalities, self.W_correction.t()) + 1.0  # [batch, pos, stream]
        corrected = innovation[:, :, None, :] * coefs[..., None] + predictions  # [batch, pos, stream, d_model]
        return self.hook_corrected(corrected.type_as(activated))

    def scale_corrected(self, x: Float[torch.Tensor, "batch pos d_model"]) -> Float[torch.Tensor, "batch pos d_model"]:
        """The corrected active stream times `correct_output_scale` (`cfg.altup_correct_scale`)."""
        return (x.type_as(self.correct_output_scale) * self.correct_output_scale).type_as(x)
