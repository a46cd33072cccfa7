"""Per-layer embeddings (PLE, Gemma 3n and Gemma 4): every layer gets a small input of its own.

Once per forward, `PerLayerEmbed` (`model.per_layer_embed`) builds `[batch, pos, n_layers, d_ple]`
from two parts: a token-identity part, a row of its own embedding table `W_E [d_vocab_ple,
n_layers * d_ple]` (the scale `sqrt(d_ple)` folded in), and a context part, the token embedding
projected by `W_proj [d_model, n_layers * d_ple]`, scaled by `d_model^-1/2` and RMS-normalized
per layer (`ln`). Their sum times `2^-1/2` is the per-layer inputs, kept in the `ForwardState`.

In block l, after the MLP, `PerLayerInput` (`blocks.{l}.per_layer`) gates its slice by the
residual stream and writes the result back: `resid += ln(act(resid W_gate) * input_l W_proj)`.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from jaxtyping import Float, Int

from hooked.components.activations import get_activation
from hooked.components.norms import make_norm
from hooked.core.config import HookedTransformerConfig
from hooked.core.errors import InputError
from hooked.core.hook_points import HookPoint
from hooked.core.validation import require_set


class PerLayerEmbed(nn.Module):
    """The per-layer inputs of every layer, from the tokens and their embeddings (module docstring)."""

    def __init__(self, cfg: HookedTransformerConfig):
        super().__init__()
        self.cfg = cfg
        d_ple = require_set(cfg.d_per_layer_input, "d_per_layer_input")
        width = cfg.n_layers * d_ple
        vocab = require_set(cfg.d_vocab_per_layer_input, "d_vocab_per_layer_input")
        self.W_E = nn.Parameter(torch.empty(vocab, width, dtype=cfg.dtype))
        self.W_proj = nn.Parameter(torch.empty(cfg.d_model, width, dtype=cfg.dtype))
        self.ln = make_norm(cfg, "RMS", d_ple)  # per layer, over d_ple
        self.hook_token_inputs = HookPoint()  # [batch, pos, n_layers, d_ple]
        self.hook_projected = HookPoint()  # [batch, pos, n_layers, d_ple]
        self.hook_per_layer_inputs = HookPoint()  # [batch, pos, n_layers, d_ple]

    def forward(
        self, tokens: Int[torch.Tensor, "batch pos"] | None, embed: Float[torch.Tensor, "batch pos d_model"]
    ) -> Float[torch.Tensor, "batch pos n_layers d_ple"]:
        if tokens is None:
            raise InputError(
                "this model (Gemma 3n/4) gives each layer an embedding of the token ids (per-layer inputs): run it "
                "on tokens or text, not on embeddings alone"
            )
        split = (*embed.shape[:-1], self.cfg.n_layers, -1)
        in_table = (tokens >= 0) & (tokens < self.W_E.shape[0])  # Gemma 3n: tokens past the table read row 0
        rows = F.embedding(torch.where(in_table, tokens, 0), self.W_E)  # [batch, pos, n_layers * d_ple]
        token_inputs = self.hook_token_inputs(rows.view(split))  # [batch, pos, n_layers, d_ple]
        projected = F.linear(embed, self.W_proj.t()) * self._scale(self.cfg.d_model**-0.5, embed)
        projected = self.hook_projected(self.ln(projected.view(split)))  # [batch, pos, n_layers, d_ple]
        return self.hook_per_layer_inputs((projected + token_inputs) * self._scale(2.0**-0.5, embed))

    def _scale(self, value: float, like: torch.Tensor) -> float | torch.Tensor:
        """A constant factor: exact, or rounded to the activations' dtype first (`cfg.per_layer_scales_in_dtype`)."""
        if not self.cfg.per_layer_scales_in_dtype:
            return value
        return torch.tensor(value, dtype=torch.float32).to(like.dtype).to(like.device)


class PerLayerInput(nn.Module):
    """One block's use of its per-layer input: `ln(act(resid W_gate) * input W_proj)`, added to the stream."""

    def __init__(self, cfg: HookedTransformerConfig):
        super().__init__()
        d_ple = require_set(cfg.d_per_layer_input, "d_per_layer_input")
        self.W_gate = nn.Parameter(torch.empty(cfg.d_model, d_ple, dtype=cfg.dtype))
        self.W_proj = nn.Parameter(torch.empty(d_ple, cfg.d_model, dtype=cfg.dtype))
        self.act_fn = get_activation(require_set(cfg.act_fn, "act_fn"))
        self.ln = make_norm(cfg, "RMS")  # never folded: it normalizes this sublayer's output
        self.hook_input = HookPoint()  # [batch, pos, d_ple]: this layer's slice of the per-layer inputs
        self.hook_gate = HookPoint()  # [batch, pos, d_ple]: act(resid W_gate)
        self.hook_out = HookPoint()  # [batch, pos, d_model]: what is added to the residual stream

    def forward(
        self, resid: Float[torch.Tensor, "batch pos d_model"], per_layer_input: Float[torch.Tensor, "batch pos d_ple"]
    ) -> Float[torch.Tensor, "batch pos d_model"]:
        gate = self.hook_gate(self.act_fn(F.linear(resid, self.W_gate.t())))  # [batch, pos, d_ple]
        gated = gate * self.hook_input(per_layer_input)  # [batch, pos, d_ple]
        return self.hook_out(self.ln(F.linear(gated, self.W_proj.t())))  # [batch, pos, d_model]
