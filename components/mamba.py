"""Mamba's mixer: a selective scan whose decay, input and readout depend on the token.

Per position t and channel c (N = `ssm_d_state`, R = `ssm_dt_rank`):

    x, z       = x W_in + b_in                              the scan's input and its gate, [d_inner] each
    x          = act(causal_conv(x))
    dt, B, C   = x W_x                                      low-rank step [R], write and read vectors [N]
    delta      = softplus(dt W_dt + b_dt)                   the discretised step, [d_inner]
    h_t        = exp(delta_t A) * h_{t-1} + delta_t x_t B_t  the state, [d_inner, N] (A = -exp(A_log))
    y_t        = h_t C_t + D x_t                             the scan's output
    out        = (y * silu(z)) W_out + b_out

The forward pass is HF's PyTorch path (`mamba_selective_scan`: the recurrence position by position,
never keeping the per-position state); a decode step is HF's `selective_state_update`. Unlike HF's
path (which starts every multi-token forward from a zero state), a forward with a cached state
continues from it, so a prompt may be fed in pieces. `hook_ssm_state` materialises the state
only when observed (`components/recurrent_state.py`).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from jaxtyping import Float

from hooked.components.causal_conv import CausalConv1d, mask_padding
from hooked.components.forward_state import ForwardState
from hooked.components.recurrent_state import hooked_states
from hooked.core.config import HookedTransformerConfig
from hooked.core.hook_points import HookPoint
from hooked.core.validation import require_set


class MambaMixer(nn.Module):
    """Mamba's token mixer with a hook on every intermediate (the state only when observed).

    Parameters: `W_in [d_model, 2 d_inner]` (x, then z: HF's `in_proj`), `b_in`, `conv.W [d_inner, kernel]`,
    `conv.b`, `W_x [d_inner, R + 2N]` (HF's `x_proj`), `W_dt [R, d_inner]`, `b_dt` (HF's `dt_proj`),
    `A_log [d_inner, N]`, `D [d_inner]`, `W_out [d_inner, d_model]`, `b_out`.
    """

    #: the projections that read the block's `ln1` output (`fold_ln` folds its gain into them)
    NORM_READERS = ("W_in",)

    def __init__(self, cfg: HookedTransformerConfig, layer: int):
        super().__init__()
        self.cfg, self.layer = cfg, layer
        self.d_inner, self.d_state = require_set(cfg.ssm_d_inner, "ssm_d_inner"), require_set(cfg.ssm_d_state, "")
        self.dt_rank = require_set(cfg.ssm_dt_rank, "ssm_dt_rank")
        d, di, dt = cfg.d_model, self.d_inner, cfg.dtype
        self.W_in = nn.Parameter(torch.empty(d, 2 * di, dtype=dt))
        self.b_in = nn.Parameter(torch.zeros(2 * di, dtype=dt))
        self.conv = CausalConv1d(di, cfg.ssm_conv_kernel, dt, cfg.ssm_act_fn)
        self.W_x = nn.Parameter(torch.empty(di, self.dt_rank + 2 * self.d_state, dtype=dt))
        self.W_dt = nn.Parameter(torch.empty(self.dt_rank, di, dtype=dt))
        self.b_dt = nn.Parameter(torch.zeros(di, dtype=dt))
        self.A_log = nn.Parameter(torch.zeros(di, self.d_state, dtype=dt))
        self.D = nn.Parameter(torch.ones(di, dtype=dt))
        self.W_out = nn.Parameter(torch.empty(di, d, dtype=dt))
        self.b_out = nn.Parameter(torch.zeros(d, dtype=dt))
        self.hook_conv_in = HookPoint()  # [batch, pos, d_inner]: x before the convolution
        self.hook_gate = HookPoint()  # [batch, pos, d_inner]: z, the gate read through silu
        self.hook_x = HookPoint()  # [batch, pos, d_inner]: the convolution's output, the scan's input
        self.hook_dt = HookPoint()  # [batch, pos, dt_rank]: the low-rank step, before W_dt
        self.hook_B = HookPoint()  # [batch, pos, d_state]: what each position writes along
        self.hook_C = HookPoint()  # [batch, pos, d_state]: what each position reads along
        self.hook_delta = HookPoint()  # [batch, pos, d_inner]: the discretised step, softplus(dt W_dt + b_dt)
        self.hook_ssm_state = HookPoint()  # [batch, pos, d_inner, d_state]: the state after each position
        self.hook_y = HookPoint()  # [batch, pos, d_inner]: h C + D x, the scan's output before the gate
        self.hook_gated = HookPoint()  # [batch, pos, d_inner]: y * silu(z), read by W_out

    def forward(
        self, x: Float[torch.Tensor, "batch pos d_model"], state: ForwardState
    ) -> Float[torch.Tensor, "batch pos d_model"]:
        entry = state.past_kv_cache[self.layer] if state.past_kv_cache is not None else None
        mask = state.new_mask()
        projected = F.linear(mask_padding(x, mask), self.W_in.t(), self.b_in)  # [batch, pos, 2 d_inner]
        xs, z = projected.chunk(2, dim=-1)
        z = self.hook_gate(z)
        xs = self.hook_conv_in(mask_padding(xs, mask))  # a padded position writes nothing, not even b_in
        xs, conv_state = self.conv(xs, None if entry is None else entry.conv_state)
        xs = self.hook_x(mask_padding(xs, mask))  # [batch, pos, d_inner]
        dt, B, C = F.linear(xs, self.W_x.t()).split([self.dt_rank, self.d_state, self.d_state], dim=-1)
        dt, B, C = self.hook_dt(dt), self.hook_B(B), self.hook_C(C)
        delta = self.hook_delta(F.softplus(torch.matmul(dt, self.W_dt) + self.b_dt))  # [batch, pos, d_inner]
        y, final = self._scan(xs, B, C, delta, None if entry is None else entry.ssm_state)
        if entry is not None:
            entry.store(conv_state, final)
        gated = self.hook_gated(self.hook_y(y) * F.silu(z))  # [batch, pos, d_inner]
        return F.linear(gated.to(x.dtype), self.W_out.t(), self.b_out)

    def _scan(self, xs, B, C, delta, initial) -> tuple[torch.Tensor, torch.Tensor]:
        """`(y [batch, pos, d_inner], final state [batch, d_inner, d_state])`, through `hook_ssm_state`."""
        A = -torch.exp(self.A_log.float())  # [d_inner, d_state]
        decay = torch.exp(A * delta[..., None].float())  # [batch, pos, d_inner, d_state]
        inputs = (delta[..., None] * B[:, :, None, :].float()) * xs[..., None].float()  # [b, pos, d_inner, d_state]
        states = hooked_states(
            self.hook_ssm_state,
            lambda: selective_scan_states(decay, inputs, initial),
            lambda edits: selective_scan_states(decay, edits, None),
        )
        if states is not None:  # an edited (or differentiated) state: read every output from it
            y = (states.to(xs.dtype) @ C[..., None])[..., 0] + xs * self.D.float()  # [batch, pos, d_inner]
            return y, states[:, -1]
        y, final = selective_scan(decay, inputs, initial, C.to(xs.dtype))
        return y + xs * self.D.float(), final


def selective_scan(
    decay: Float[torch.Tensor, "batch pos d_inner d_state"],
    inputs: Float[torch.Tensor, "batch pos d_inner d_state"],
    initial: Float[torch.Tensor, "batch d_inner d_state"] | None,
    C: Float[torch.Tensor, "batch pos d_state"],
) -> tuple[Float[torch.Tensor, "batch pos d_inner"], Float[torch.Tensor, "batch d_inner d_state"]]:
    """`h_t = decay_t * h_{t-1} + inputs_t`, position by position (HF's recurrent loop), never keeping the
    states: `(h_t C_t for every t, the final state)`."""
    h = torch.zeros_like(inputs[:, 0]) if initial is None else initial.float()  # [batch, d_inner, d_state]
    outputs = []
    for t in range(inputs.shape[1]):
        h = decay[:, t] * h + inputs[:, t]
        outputs.append(torch.matmul(h.to(C.dtype), C[:, t, :, None])[..., 0])  # [batch, d_inner]
    return torch.stack(outputs, dim=1), h


def selective_scan_states(
    decay: Float[torch.Tensor, "batch pos d_inner d_state"],
    inputs: Float[torch.Tensor, "batch pos d_inner d_state"],
    initial: Float[torch.Tensor, "batch d_inner d_state"] | None,
) -> Float[torch.Tensor, "batch pos d_inner d_state"]:
    """The same recurrence, keeping every position's state (or, on edits as `inputs`, carrying them forward)."""
    h = torch.zeros_like(inputs[:, 0]) if initial is None else initial.float()
    states = torch.empty_like(inputs)  # written in place: one copy of the states
    for t in range(inputs.shape[1]):
        h = decay[:, t] * h + inputs[:, t]
        states[:, t] = h
    return states
