"""Gated DeltaNet (Qwen3-Next, Qwen3.5): linear attention whose state is updated by a gated delta rule.

Per position t and value head h (key heads are shared by `n_value_heads // n_key_heads` value heads):

    qkv, z, b, a = x W_in                         (HF's separate or interleaved in-projections, side by side)
    q, k, v     = act(causal_conv(qkv))           q, k [key_head, d_key], v [value_head, d_value]
    z                                             the output gate, [value_head, d_value]
    beta        = sigmoid(b)                      how much of the prediction error each position writes
    log_decay   = -exp(A_log) * softplus(a + dt_bias)           (HF's `g`; the state decays by its exp)
    q, k        = l2norm(q), l2norm(k);  q = q / sqrt(d_key)
    S_t         = exp(log_decay_t) S_{t-1}                      the state, [d_key, d_value]
    S_t         = S_t + beta_t k_t (v_t - k_t^T S_t)^T           the delta rule: correct what S predicts for k
    y_t         = S_t^T q_t
    out         = (rms_norm(y) * w * silu(z)) W_out              (per head)

The fast path is HF's PyTorch chunked algorithm (`torch_chunk_gated_delta_rule`, chunks of 64 with a
triangular solve inside each); a decode step is its recurrent form. `hook_ssm_state` materialises
`S_t` only when observed (`components/recurrent_state.py`).
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

#: HF's chunk length (a fixed argument of `torch_chunk_gated_delta_rule`)
DELTANET_CHUNK = 64


class NormThenGate(nn.Module):
    """`(w * rms_norm(y)) * silu(z)` per head: HF's `Qwen3NextRMSNormGated` (norm first, then the gate)."""

    def __init__(self, length: int, eps: float, dtype: torch.dtype):
        super().__init__()
        self.w = nn.Parameter(torch.ones(length, dtype=dtype))
        self.eps = eps

    def forward(
        self, y: Float[torch.Tensor, "... d_value"], z: Float[torch.Tensor, "... d_value"]
    ) -> Float[torch.Tensor, "... d_value"]:
        y32 = y.float()
        normed = self.w * (y32 * torch.rsqrt(y32.pow(2).mean(-1, keepdim=True) + self.eps)).to(y.dtype)
        return (normed * F.silu(z.float())).to(y.dtype)


class GatedDeltaNet(nn.Module):
    """The gated DeltaNet token mixer with a hook on every intermediate (the state only when observed).

    Parameters: `W_in [d_model, 2 key_dim + 2 value_dim + 2 value_head]`, the input projections side by
    side in one matrix (one matmul): q, k, v (Qwen3.5's `in_proj_qkv`), z (`in_proj_z`), b (`in_proj_b`),
    a (`in_proj_a`); Qwen3-Next's interleaved `in_proj_qkvz`/`in_proj_ba` are reordered into it on load.
    `conv.W [2 key_dim + value_dim, kernel]`, `dt_bias`, `A_log [value_head]`, `norm.w [d_value]`,
    `W_out [value_dim, d_model]`.
    """

    #: the projections that read the block's `ln1` output (`fold_ln` folds its gain into them)
    NORM_READERS = ("W_in",)

    def __init__(self, cfg: HookedTransformerConfig, layer: int):
        super().__init__()
        self.cfg, self.layer = cfg, layer
        self.n_k = require_set(cfg.deltanet_n_key_heads, "deltanet_n_key_heads")
        self.n_v = require_set(cfg.deltanet_n_value_heads, "deltanet_n_value_heads")
        self.d_k = require_set(cfg.deltanet_d_key_head, "deltanet_d_key_head")
        self.d_v = require_set(cfg.deltanet_d_value_head, "deltanet_d_value_head")
        key_dim, value_dim, d, dt = self.n_k * self.d_k, self.n_v * self.d_v, cfg.d_model, cfg.dtype
        self.splits = [2 * key_dim + value_dim, value_dim, self.n_v, self.n_v]  # qkv, z, b, a
        self.W_in = nn.Parameter(torch.empty(d, sum(self.splits), dtype=dt))
        self.conv = CausalConv1d(2 * key_dim + value_dim, cfg.ssm_conv_kernel, dt, cfg.ssm_act_fn)
        self.dt_bias = nn.Parameter(torch.ones(self.n_v, dtype=dt))
        self.A_log = nn.Parameter(torch.zeros(self.n_v, dtype=dt))
        self.norm = NormThenGate(self.d_v, cfg.eps, dt)
        self.W_out = nn.Parameter(torch.empty(value_dim, d, dtype=dt))
        self.hook_conv_in = HookPoint()  # [batch, pos, 2 key_dim + value_dim]: q, k, v before the convolution
        self.hook_conv_out = HookPoint()  # [batch, pos, 2 key_dim + value_dim]: after it and its activation
        self.hook_q = HookPoint()  # [batch, pos, key_head, d_key]: before the l2 norm
        self.hook_k = HookPoint()  # [batch, pos, key_head, d_key]: before the l2 norm
        self.hook_v = HookPoint()  # [batch, pos, value_head, d_value]
        self.hook_gate = HookPoint()  # [batch, pos, value_head, d_value]: z, read through silu
        self.hook_beta = HookPoint()  # [batch, pos, value_head]: sigmoid(b), the write strength
        self.hook_log_decay = HookPoint()  # [batch, pos, value_head]: HF's g (<= 0); the state decays by exp(g)
        self.hook_ssm_state = HookPoint()  # [batch, pos, value_head, d_key, d_value]: the state after each position
        self.hook_y = HookPoint()  # [batch, pos, value_head, d_value]: S^T q, before the norm and gate
        self.hook_normed = HookPoint()  # [batch, pos, value_head, d_value]: w * rms_norm(y) * silu(z)

    def forward(
        self, x: Float[torch.Tensor, "batch pos d_model"], state: ForwardState
    ) -> Float[torch.Tensor, "batch pos d_model"]:
        entry = state.past_kv_cache[self.layer] if state.past_kv_cache is not None else None
        x = mask_padding(x, state.new_mask())
        batch, n_pos = x.shape[:2]
        mixed, z, b, a = F.linear(x, self.W_in.t()).split(self.splits, dim=-1)  # b, a: [batch, pos, value_head]
        mixed = self.hook_conv_in(mixed)  # [batch, pos, 2 key_dim + value_dim]
        z = self.hook_gate(z.reshape(batch, n_pos, self.n_v, self.d_v))
        mixed, conv_state = self.conv(mixed, None if entry is None else entry.conv_state)
        q, k, v = self.hook_conv_out(mixed).split([self.n_k * self.d_k, self.n_k * self.d_k, self.n_v * self.d_v], -1)
        q = self.hook_q(q.reshape(batch, n_pos, self.n_k, self.d_k))  # [batch, pos, key_head, d_key]
        k = self.hook_k(k.reshape(batch, n_pos, self.n_k, self.d_k))
        v = self.hook_v(v.reshape(batch, n_pos, self.n_v, self.d_v))  # [batch, pos, value_head, d_value]
        beta = self.hook_beta(b.sigmoid())
        log_decay = self.hook_log_decay(-self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias))
        y, final = self._rule(q, k, v, log_decay, beta, None if entry is None else entry.ssm_state)
        if entry is not None:
            entry.store(conv_state, final)
        normed = self.hook_normed(self.norm(self.hook_y(y.to(x.dtype)), z))  # [batch, pos, value_head, d_value]
        return F.linear(normed.reshape(batch, n_pos, -1), self.W_out.t())

    def _rule(self, q, k, v, log_decay, beta, initial) -> tuple[torch.Tensor, torch.Tensor]:
        """`(y [batch, pos, value_head, d_value], final state)` by the gated delta rule, through `hook_ssm_state`."""
        q, k, v, beta, decay = _heads_first(q, k, v, beta, log_decay, self.n_v // self.n_k)
        states = hooked_states(
            self.hook_ssm_state,
            lambda: delta_rule_states(k, v, decay, beta, initial),
            lambda edits: delta_rule_states(k, None, decay, beta, None, edits),
        )
        scale = q.shape[-1] ** -0.5
        if states is not None:  # an edited (or differentiated) state: read every output from it
            y = (states * (q * scale).transpose(1, 2)[..., None]).sum(-2)  # [batch, pos, value_head, d_value]
            return y, states[:, -1]
        if initial is not None and q.shape[2] == 1:  # a decode step: HF's recurrent form (which divides q)
            y, final = recurrent_delta_rule(q / q.shape[-1] ** 0.5, k, v, decay, beta, initial)
        else:
            y, final = chunk_delta_rule(q * scale, k, v, decay, beta, initial)
        return y.transpose(1, 2).contiguous(), final


def _heads_first(q, k, v, beta, log_decay, repeats: int):
    """As HF: key heads repeated up to the value heads, everything float32 `[batch, head, pos, ...]`,
    q and k l2-normalized (eps 1e-6); the callers scale q by `1/sqrt(d_key)` as their HF twin does."""
    if repeats > 1:
        q, k = q.repeat_interleave(repeats, dim=2), k.repeat_interleave(repeats, dim=2)
    q, k, v, beta, decay = (
        t.transpose(1, 2).to(torch.float32, memory_format=torch.contiguous_format) for t in (q, k, v, beta, log_decay)
    )
    q = q * torch.rsqrt((q * q).sum(dim=-1, keepdim=True) + 1e-6)
    k = k * torch.rsqrt((k * k).sum(dim=-1, keepdim=True) + 1e-6)
    return q, k, v, beta, decay


def delta_rule_states(
    k: Float[torch.Tensor, "batch head pos d_key"],
    v: Float[torch.Tensor, "batch head pos d_value"] | None,
    decay: Float[torch.Tensor, "batch head pos"],
    beta: Float[torch.Tensor, "batch head pos"],
    initial: Float[torch.Tensor, "batch head d_key d_value"] | None,
    edits: Float[torch.Tensor, "batch pos head d_key d_value"] | None = None,
) -> Float[torch.Tensor, "batch pos head d_key d_value"]:
    """Every position's state by the recurrence (HF's recurrent form), `edits[:, t]` added after step t.

    `v` None runs the rule without its input (what carries edits forward): then only `edits` write.
    """
    batch, n_heads, n_pos, d_key = k.shape
    d_value = v.shape[-1] if v is not None else edits.shape[-1]  # type: ignore[union-attr]
    S = k.new_zeros(batch, n_heads, d_key, d_value) if initial is None else initial.float()
    states = k.new_empty(batch, n_pos, n_heads, d_key, d_value)  # written in place: one copy of the states
    for t in range(n_pos):
        S = S * decay[:, :, t].exp()[..., None, None]
        k_t = k[:, :, t]  # [batch, head, d_key]
        kv_mem = (S * k_t.unsqueeze(-1)).sum(dim=-2)  # [batch, head, d_value]
        target = -kv_mem if v is None else v[:, :, t] - kv_mem
        S = S + k_t.unsqueeze(-1) * (target * beta[:, :, t].unsqueeze(-1)).unsqueeze(-2)
        if edits is not None:
            S = S + edits[:, t]
        states[:, t] = S
    return states


def recurrent_delta_rule(q, k, v, decay, beta, initial) -> tuple[torch.Tensor, torch.Tensor]:
    """HF's `torch_recurrent_gated_delta_rule` on prepared `[batch, head, pos, ...]` inputs: `(y, final)`."""
    S = initial.to(v)
    out = torch.zeros_like(v)
    for t in range(q.shape[2]):
        S = S * decay[:, :, t].exp()[..., None, None]
        kv_mem = (S * k[:, :, t].unsqueeze(-1)).sum(dim=-2)
        delta = (v[:, :, t] - kv_mem) * beta[:, :, t].unsqueeze(-1)
        S = S + k[:, :, t].unsqueeze(-1) * delta.unsqueeze(-2)
        out[:, :, t] = (S * q[:, :, t].unsqueeze(-1)).sum(dim=-2)
    return out, S


def chunk_delta_rule(q, k, v, decay, beta, initial, chunk: int = DELTANET_CHUNK) -> tuple[torch.Tensor, torch.Tensor]:
    """HF's `torch_chunk_gated_delta_rule` on prepared `[batch, head, pos, ...]` inputs: `(y, final)`, float32.

    Inside a chunk the delta-rule updates are condensed by a triangular solve (the UT transform); the
    state is carried across chunks one chunk at a time.
    """
    batch, n_heads, n_pos, d_key = k.shape
    d_value = v.shape[-1]
    pad = (chunk - n_pos % chunk) % chunk
    q, k, v = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, v))
    beta, decay = F.pad(beta, (0, pad)), F.pad(decay, (0, pad))
    v_beta, k_beta = v * beta.unsqueeze(-1), k * beta.unsqueeze(-1)
    q, k, k_beta, v_beta = (t.reshape(batch, n_heads, -1, chunk, t.shape[-1]) for t in (q, k, k_beta, v_beta))
    decay = decay.reshape(batch, n_heads, -1, chunk).cumsum(dim=3)  # [batch, head, n_chunks, chunk]
    upper = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).triu(1)
    pairwise = (decay.unsqueeze(4) - decay.unsqueeze(3)).masked_fill(upper, float("-inf")).exp()
    ut_system = (k_beta @ k.transpose(-1, -2)) * pairwise
    intra = (q @ k.transpose(-1, -2)) * pairwise
    decayed_k_beta = k_beta * decay.exp().unsqueeze(-1)
    # HF's two solves against one system, as one (each right-hand column is solved on its own)
    solved = torch.linalg.solve_triangular(
        ut_system, torch.cat([v_beta, decayed_k_beta], dim=-1), upper=False, unitriangular=True
    )
    new_values, k_cumdecay = solved.split([d_value, d_key], dim=-1)
    S = torch.zeros(batch, n_heads, d_key, d_value, dtype=new_values.dtype, device=q.device)
    S = S if initial is None else initial.to(new_values)
    out = torch.zeros_like(new_values)
    q = q * decay.exp().unsqueeze(-1)
    k = k * (decay[..., -1:] - decay).exp().unsqueeze(-1)
    chunk_decay = decay[..., -1].exp()[..., None, None]
    for i in range(q.shape[2]):
        v_new = new_values[:, :, i] - k_cumdecay[:, :, i] @ S
        out[:, :, i] = q[:, :, i] @ S + intra[:, :, i] @ v_new
        S = S * chunk_decay[:, :, i] + k[:, :, i].transpose(-1, -2) @ v_new
    return out.reshape(batch, n_heads, -1, d_value)[:, :, :n_pos], S
