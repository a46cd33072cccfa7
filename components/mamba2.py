"""Mamba-2's mixer (SSD): a selective state space with one scalar decay per head, scanned chunk by chunk.

Per position t and head h (P = `d_head`, N = `ssm_d_state`, G groups of heads share B and C):

    z, xBC, dt = x W_in + b_in                                   (gate, conv input, raw step)
    x, B, C    = act(causal_conv(xBC))                           x [H, P], B and C [G, N]
    delta      = clamp(softplus(dt + dt_bias), dt_limit)         the discretised step, [H]
    log_decay  = delta * A,  A = -exp(A_log)                     the state is multiplied by exp(log_decay)
    h_t        = exp(log_decay_t) h_{t-1} + (delta_t x_t) B_t^T  the state, [H, P, N]
    y_t        = h_t C_t + D x_t                                 the scan's output, [H, P]
    out        = gated_rms_norm(y * silu(z)) W_out + b_out

The fast path is HF's PyTorch SSD (`mamba2_chunk_scan`): chunks of `ssm_chunk_size` positions,
quadratic inside a chunk, a recurrence over chunk boundaries; it never builds the per-position
state. A decode step (one new position with a cached state) is HF's `selective_state_update`.
`hook_ssm_state` materialises the state only when observed (`components/recurrent_state.py`).
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


class GatedRMSNorm(nn.Module):
    """`w * rms_norm(y * silu(z))` over groups of `group` channels, in float32 (HF's `MambaRMSNormGated`)."""

    def __init__(self, length: int, group: int, eps: float, dtype: torch.dtype):
        super().__init__()
        self.w = nn.Parameter(torch.ones(length, dtype=dtype))
        self.group, self.eps = group, eps

    def forward(
        self, y: Float[torch.Tensor, "batch pos d_inner"], z: Float[torch.Tensor, "batch pos d_inner"]
    ) -> Float[torch.Tensor, "batch pos d_inner"]:
        dtype = y.dtype
        gated = y.float() * F.silu(z.float())  # [batch, pos, d_inner]
        grouped = gated.view(*gated.shape[:-1], -1, self.group)  # [batch, pos, n_groups, group]
        grouped = grouped * torch.rsqrt(grouped.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.w * grouped.view(gated.shape).to(dtype)


class Mamba2Mixer(nn.Module):
    """Mamba-2's token mixer with a hook on every intermediate (the state only when observed).

    Parameters: `W_in [d_model, d_inner + conv_dim + H]` (gate, then x/B/C, then dt, HF's `in_proj` order),
    `b_in`, `conv.W [conv_dim, kernel]`, `conv.b`, `dt_bias [H]`, `A_log [H]`, `D [H]`, `norm.w [d_inner]`,
    `W_out [d_inner, d_model]`, `b_out`.
    """

    #: the projections that read the block's `ln1` output (`fold_ln` folds its gain into them)
    NORM_READERS = ("W_in",)

    def __init__(self, cfg: HookedTransformerConfig, layer: int):
        super().__init__()
        self.cfg, self.layer = cfg, layer
        self.n_heads = H = require_set(cfg.ssm_n_heads, "ssm_n_heads")
        self.d_inner = require_set(cfg.ssm_d_inner, "ssm_d_inner")
        self.d_state, self.n_groups = require_set(cfg.ssm_d_state, "ssm_d_state"), cfg.ssm_n_groups
        self.d_head = self.d_inner // H
        conv_dim = self.d_inner + 2 * self.n_groups * self.d_state
        d, dt = cfg.d_model, cfg.dtype
        self.W_in = nn.Parameter(torch.empty(d, self.d_inner + conv_dim + H, dtype=dt))
        self.b_in = nn.Parameter(torch.zeros(self.d_inner + conv_dim + H, dtype=dt))
        self.conv = CausalConv1d(conv_dim, cfg.ssm_conv_kernel, dt, cfg.ssm_act_fn)
        self.dt_bias = nn.Parameter(torch.zeros(H, dtype=dt))
        self.A_log = nn.Parameter(torch.zeros(H, dtype=dt))
        self.D = nn.Parameter(torch.ones(H, dtype=dt))
        self.norm = GatedRMSNorm(self.d_inner, self.d_inner // self.n_groups, cfg.eps, dt)
        self.W_out = nn.Parameter(torch.empty(self.d_inner, d, dtype=dt))
        self.b_out = nn.Parameter(torch.zeros(d, dtype=dt))
        self.hook_gate = HookPoint()  # [batch, pos, d_inner]: z, read through silu by the gated norm
        self.hook_conv_in = HookPoint()  # [batch, pos, conv_dim]: x, B, C before the convolution
        self.hook_conv_out = HookPoint()  # [batch, pos, conv_dim]: after the convolution and its activation
        self.hook_x = HookPoint()  # [batch, pos, head, d_head]: the scan's input
        self.hook_B = HookPoint()  # [batch, pos, group, d_state]: what each position writes along
        self.hook_C = HookPoint()  # [batch, pos, group, d_state]: what each position reads along
        self.hook_dt = HookPoint()  # [batch, pos, head]: the raw step, before dt_bias and softplus
        self.hook_delta = HookPoint()  # [batch, pos, head]: the discretised step, clamp(softplus(dt + dt_bias))
        self.hook_log_decay = HookPoint()  # [batch, pos, head]: delta * A (<= 0); the state decays by its exp
        self.hook_ssm_state = HookPoint()  # [batch, pos, head, d_head, d_state]: the state after each position
        self.hook_y = HookPoint()  # [batch, pos, head, d_head]: h C + D x, the scan's output before the gate
        self.hook_normed = HookPoint()  # [batch, pos, d_inner]: the gated RMSNorm's output, read by W_out

    def forward(
        self, x: Float[torch.Tensor, "batch pos d_model"], state: ForwardState
    ) -> Float[torch.Tensor, "batch pos d_model"]:
        entry = state.past_kv_cache[self.layer] if state.past_kv_cache is not None else None
        mask = state.new_mask()
        projected = F.linear(mask_padding(x, mask), self.W_in.t(), self.b_in)  # [batch, pos, in_proj]
        z, xBC, dt = projected.split(
            [self.d_inner, projected.shape[-1] - self.d_inner - self.n_heads, self.n_heads], -1
        )
        z, dt = self.hook_gate(z), self.hook_dt(dt)
        xBC = self.hook_conv_in(mask_padding(xBC, mask))  # a padded position writes nothing, not even b_in
        conv_out, conv_state = self.conv(xBC, None if entry is None else entry.conv_state)
        conv_out = self.hook_conv_out(mask_padding(conv_out, mask))  # [batch, pos, conv_dim]
        xs, B, C = conv_out.split([self.d_inner, self.n_groups * self.d_state, self.n_groups * self.d_state], -1)
        batch, n_pos = xs.shape[:2]
        xs = self.hook_x(xs.reshape(batch, n_pos, self.n_heads, self.d_head))  # [batch, pos, head, d_head]
        B = self.hook_B(B.reshape(batch, n_pos, self.n_groups, self.d_state))  # [batch, pos, group, d_state]
        C = self.hook_C(C.reshape(batch, n_pos, self.n_groups, self.d_state))  # [batch, pos, group, d_state]
        delta = F.softplus(dt + self.dt_bias.to(dt.dtype))  # [batch, pos, head]
        low, high = self.cfg.ssm_dt_limit
        delta = self.hook_delta(torch.clamp(delta, min=low, max=high))
        A = -torch.exp(self.A_log.float())  # [head]
        log_decay = self.hook_log_decay(A * delta.float())  # [batch, pos, head], float32
        initial = None if entry is None else entry.ssm_state
        y, final = self._scan(xs, B, C, delta, log_decay, initial)  # [batch, pos, head, d_head]
        if entry is not None:
            entry.store(conv_state, final)
        y = self.hook_y(y)
        normed = self.hook_normed(self.norm(y.reshape(batch, n_pos, self.d_inner), z))  # [batch, pos, d_inner]
        return F.linear(normed.to(x.dtype), self.W_out.t(), self.b_out)

    def _scan(self, xs, B, C, delta, log_decay, initial) -> tuple[torch.Tensor, torch.Tensor]:
        """`(y [batch, pos, head, d_head], final state [batch, head, d_head, d_state])`, through `hook_ssm_state`."""
        B, C = self._per_head(B), self._per_head(C)  # [batch, pos, head, d_state], float32
        x_dt = xs.float() * delta[..., None].float()  # [batch, pos, head, d_head]
        states = hooked_states(
            self.hook_ssm_state,
            lambda: materialise_states(log_decay, x_dt, B, initial),
            lambda edits: materialise_states(log_decay, edits, None),
        )
        if states is not None:  # an edited (or differentiated) state: read every output from it
            y = (states @ C[..., None])[..., 0] + self.D.float()[:, None] * xs.float()  # [batch, pos, head, d_head]
            return y, states[:, -1]
        if initial is not None and xs.shape[1] == 1:  # a decode step: HF's selective_state_update
            return self._step(xs, B, C, delta, log_decay, initial)
        return ssd_chunk_scan(xs, x_dt, log_decay, B, C, self.D, self.cfg.ssm_chunk_size, initial)

    def _per_head(self, t: Float[torch.Tensor, "batch pos group d_state"]) -> torch.Tensor:
        return t.float().repeat_interleave(self.n_heads // self.n_groups, dim=2)  # [batch, pos, head, d_state]

    def _step(self, xs, B, C, delta, log_decay, initial) -> tuple[torch.Tensor, torch.Tensor]:
        """One position from the cached state, in HF's order: `h * exp(delta A) + (delta B) x`, then `h C + D x`."""
        x = xs[:, 0]  # [batch, head, d_head]
        dB = delta[:, 0, :, None, None].float() * B[:, 0, :, None, :]  # [batch, head, 1, d_state]
        h = initial.float() * torch.exp(log_decay[:, 0, :, None, None]) + dB * x[..., None].float()
        y = (h @ C[:, 0, :, :, None])[..., 0] + x.float() * self.D.float()[:, None]  # [batch, head, d_head]
        return y[:, None], h


def materialise_states(
    log_decay: Float[torch.Tensor, "batch pos head"],
    inputs: Float[torch.Tensor, "batch pos head d_head"] | Float[torch.Tensor, "batch pos head d_head d_state"],
    B: Float[torch.Tensor, "batch pos head d_state"] | None,
    initial: Float[torch.Tensor, "batch head d_head d_state"] | None = None,
) -> Float[torch.Tensor, "batch pos head d_head d_state"]:
    """Every position's state, `h_t = exp(log_decay_t) h_{t-1} + u_t`, by the plain recurrence.

    `u_t` is `inputs_t B_t^T` (inputs `[..., d_head]` with `B`) or `inputs_t` itself (a state-shaped edit,
    `B` None: the recurrence without its input, which carries edits forward).
    """
    decay = torch.exp(log_decay.float())[..., None, None]  # [batch, pos, head, 1, 1]
    batch, n_pos, n_heads, d_head = inputs.shape[:4]
    d_state = B.shape[-1] if B is not None else inputs.shape[-1]
    h = inputs.new_zeros(batch, n_heads, d_head, d_state) if initial is None else initial.float()
    states = inputs.new_empty(batch, n_pos, n_heads, d_head, d_state)  # written in place: one copy of the states
    for t in range(n_pos):
        u = inputs[:, t, ..., None] * B[:, t, :, None, :] if B is not None else inputs[:, t]  # [b, head, d_head, N]
        h = h * decay[:, t] + u
        states[:, t] = h
    return states


def _segment_sum(x: Float[torch.Tensor, "... chunk"]) -> Float[torch.Tensor, "... chunk chunk"]:
    """`out[..., i, j] = sum_{j < k <= i} x[..., k]` below the diagonal, -inf above it (HF's `segment_sum`)."""
    chunk = x.shape[-1]
    x = x[..., None].expand(*x.shape, chunk)  # [..., chunk, chunk]
    strict = torch.tril(torch.ones(chunk, chunk, device=x.device, dtype=torch.bool), diagonal=-1)
    sums = torch.cumsum(x.masked_fill(~strict, 0), dim=-2)
    lower = torch.tril(torch.ones(chunk, chunk, device=x.device, dtype=torch.bool), diagonal=0)
    return sums.masked_fill(~lower, -torch.inf)


def ssd_chunk_scan(
    xs: Float[torch.Tensor, "batch pos head d_head"],
    x_dt: Float[torch.Tensor, "batch pos head d_head"],
    log_decay: Float[torch.Tensor, "batch pos head"],
    B: Float[torch.Tensor, "batch pos head d_state"],
    C: Float[torch.Tensor, "batch pos head d_state"],
    D: Float[torch.Tensor, "head"],
    chunk: int,
    initial: Float[torch.Tensor, "batch head d_head d_state"] | None = None,
) -> tuple[Float[torch.Tensor, "batch pos head d_head"], Float[torch.Tensor, "batch head d_head d_state"]]:
    """The SSD scan, chunk by chunk, in HF's ops and order (`mamba2_chunk_scan`); `(y, final state)`, float32.

    Inside a chunk the output is an attention-like product masked by the decays between positions;
    across chunks only each chunk's end state is carried (b: batch, c: chunk, l/s: positions in a
    chunk, h: head, p: d_head, n: d_state).
    """
    batch, n_pos, n_heads, d_head = xs.shape
    pad = (chunk - n_pos % chunk) % chunk
    D_residual = D[..., None] * F.pad(xs.float(), (0, 0, 0, 0, 0, pad))  # [batch, pos + pad, head, d_head]

    def chunks(t: torch.Tensor) -> torch.Tensor:  # [batch, pos, ...] -> [batch, n_chunks, chunk, ...]
        t = F.pad(t, (0, 0) * (t.ndim - 2) + (0, pad))
        return t.reshape(batch, -1, chunk, *t.shape[2:])

    x, A, B, C = chunks(x_dt), chunks(log_decay), chunks(B), chunks(C)
    A = A.permute(0, 3, 1, 2)  # [batch, head, n_chunks, chunk]
    A_cumsum = torch.cumsum(A, dim=-1)
    L = torch.exp(_segment_sum(A))  # [batch, head, n_chunks, chunk, chunk]
    G = torch.einsum("bclhn,bcshn->bclsh", C, B)
    M = G * L.permute(0, 2, 3, 4, 1)
    Y_diag = torch.einsum("bclsh,bcshp->bclhp", M, x)
    decay_states = torch.exp(A_cumsum[:, :, :, -1:] - A_cumsum)
    B_decay = B * decay_states.permute(0, -2, -1, 1)[..., None]
    states = torch.einsum("bclhn,bclhp->bchpn", B_decay, x)  # each chunk's contribution to its end state
    previous = torch.zeros_like(states[:, :1]) if initial is None else initial[:, None].to(states)
    states = torch.cat([previous, states], dim=1)
    decay_chunk = torch.exp(_segment_sum(F.pad(A_cumsum[:, :, :, -1], (1, 0)))).transpose(1, 3)
    new_states = torch.einsum("bzch,bzhpn->bchpn", decay_chunk, states)
    states, final = new_states[:, :-1], new_states[:, -1]
    C_times_states = torch.einsum("bclhn,bchpn->bclhp", C, states)
    Y_off = C_times_states * torch.exp(A_cumsum).permute(0, 2, 3, 1)[..., None]
    y = (Y_diag + Y_off).contiguous().reshape(batch, -1, n_heads, d_head) + D_residual
    return y[:, :n_pos], final
