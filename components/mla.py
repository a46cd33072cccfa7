"""Multi-head latent attention (MLA, DeepSeek-V2/V3): every head's keys and values come from one small latent.

Ordinary attention projects each token to a key and a value per head and caches them all.
MLA compresses each token into one KV latent (`kv_lora_rank` wide, e.g. 512) plus one rotary
key shared by every head (`rotary_dim`, e.g. 64), caches only those, and up-projects the
latent into each head's keys and values when it attends. Per head, with `r = kv_lora_rank`:

    query latent   c_q  = RMSNorm(x W_Q_A + b_Q_A)                 hook_q_latent   [batch, pos, q_lora_rank]
    queries        q[h] = c_q W_Q_B[h] = [q_nope[h] | q_rope[h]]    hook_q          [batch, pos, head, d_head]
                   (no query latent, q_lora_rank None: q[h] = x W_Q_B[h])
    KV latent      c_kv = RMSNorm(x W_KV_A[:, :r] + b_KV_A[:r])     hook_kv_latent  [batch, pos, kv_lora_rank]
    shared key     k_r  = x W_KV_A[:, r:] + b_KV_A[r:]              hook_k_rope     [batch, pos, rotary_dim]
    from the latent [k_nope[h] | v[h]] = c_kv W_KV_B[h]             hook_k_nope, hook_v
    keys           k[h] = [k_nope[h] | k_r]                          hook_k          [batch, pos, head, d_head]

Rotary positions rotate the last `rotary_dim` dims of q and k (`q_rope` and the shared
`k_r`: hook_rot_q, hook_rot_k, hook_rot_k_rope), then attention is `Attention`'s, with
`d_head = d_nope + rotary_dim` for scores and `d_value` for values, `z` and `W_O`.
The KV cache stores `c_kv` and the rotated `k_r` (`cfg.kv_cache_entry_shape(layer)`): each step
up-projects the whole cached latent again, as HF does. So `hook_k`, `hook_v`, ... fire on
the new positions only (as in ordinary attention), but an edit of them lasts for the
forward that computes it; an edit of `hook_kv_latent` or `hook_rot_k_rope` is cached.

Weight views (`W_Q`, `W_K`, `W_V`, `b_Q`, ...) are the products of the factors with each
latent norm's gain in between, its per-token scale left out (as TransformerLens leaves out
`ln1`'s): `q[h] = (x W_Q[h] + b_Q[h]) / s_q`, `v[h] = (x W_V[h] + b_V[h]) / s_kv`, the key's
non-rotary part divided by `s_kv` and its rotary part not at all (`s_*` the latent norms'
`hook_scale`). So `QK`/`OV` circuits, composition scores and per-head attributions run.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from jaxtyping import Float, Int

from hooked.components.attention import Attention, head_major
from hooked.components.forward_state import ForwardState
from hooked.components.norms import RMSNorm, RMSNormPre
from hooked.components.rotary import (
    apply_rotary_interleaved,
    length_dependent,
    rotary_attention_factor,
    rotary_inv_freq,
)
from hooked.core.config import HookedTransformerConfig
from hooked.core.errors import InputError
from hooked.core.hook_points import HookPoint
from hooked.core.validation import require_set

#: HF builds the latent norms with its RMSNorm's default eps whatever `rms_norm_eps` says
LATENT_NORM_EPS = 1e-6


def latent_norm(cfg: HookedTransformerConfig, length: int, folded: bool = False) -> RMSNormPre:
    """An RMSNorm over a latent (`RMSNormPre` once `fold_ln` has folded its gain into the up-projection)."""
    norm = RMSNormPre(cfg, length) if folded else RMSNorm(cfg, length)
    norm.eps = LATENT_NORM_EPS
    return norm


def up_project(
    x: Float[torch.Tensor, "batch pos d_in"], W: Float[torch.Tensor, "head d_in d_out"]
) -> Float[torch.Tensor, "batch pos head d_out"]:
    """`x @ W[h]` for every head, one bias-free matmul as HF's `q_b_proj`/`kv_b_proj` (`W` stored head-major)."""
    n_heads, d_in, d_out = W.shape
    W_flat = W.transpose(1, 2).reshape(n_heads * d_out, d_in)  # [head * d_out, d_in]: a view of head-major storage
    return F.linear(x, W_flat).view(*x.shape[:-1], n_heads, d_out)


class MultiHeadLatentAttention(Attention):
    """MLA: queries from a query latent, keys and values from a cached KV latent plus a shared rotary key.

    Stored weights (right-multiplying, TransformerLens style): `W_Q_A` `[d_model, q_lora_rank]`,
    `b_Q_A`, `q_a_norm`, `W_Q_B` `[head, q_lora_rank or d_model, d_head]`; `W_KV_A`
    `[d_model, kv_lora_rank + rotary_dim]` (the latent, then the shared rotary key, one matmul as
    HF's `kv_a_proj_with_mqa`), `b_KV_A`, `kv_a_norm`, `W_KV_B` `[head, kv_lora_rank, d_nope + d_value]`
    (each head's key then value); `W_O` `[head, d_value, d_model]`, `b_O`.
    """

    def __init__(self, cfg: HookedTransformerConfig | dict, layer: int = 0):
        nn.Module.__init__(self)
        cfg = HookedTransformerConfig.unwrap(cfg)
        self.cfg, self.layer = cfg, layer
        H, d, dh, dt = cfg.n_heads, cfg.d_model, cfg.d_head, cfg.dtype
        self.r, self.d_rope = require_set(cfg.kv_lora_rank, "kv_lora_rank"), require_set(cfg.rotary_dim, "rotary_dim")
        self.d_nope, self.d_v = dh - self.d_rope, cfg.d_value
        if cfg.q_lora_rank:
            self.W_Q_A = nn.Parameter(torch.empty(d, cfg.q_lora_rank, dtype=dt))
            self.b_Q_A = nn.Parameter(torch.zeros(cfg.q_lora_rank, dtype=dt))
            self.q_a_norm = latent_norm(cfg, cfg.q_lora_rank)
        self.W_Q_B = nn.Parameter(head_major(H, cfg.q_lora_rank or d, dh, dt))
        self.W_KV_A = nn.Parameter(torch.empty(d, self.r + self.d_rope, dtype=dt))
        self.b_KV_A = nn.Parameter(torch.zeros(self.r + self.d_rope, dtype=dt))
        self.kv_a_norm = latent_norm(cfg, self.r)
        self.W_KV_B = nn.Parameter(head_major(H, self.r, self.d_nope + self.d_v, dt))
        self.W_O = nn.Parameter(torch.empty(H, self.d_v, d, dtype=dt))
        self.b_O = nn.Parameter(torch.zeros(d, dtype=dt))
        self.scale, self.divisor = 1.0 / cfg.attn_scale, cfg.attn_scale
        self.attn_type, self.window, self.alibi_slopes, self.rotary = "global", None, None, True
        self._init_rotary(cfg)
        self._init_hooks()
        self._init_attention_buffers()

    def _init_rotary(self, cfg: HookedTransformerConfig) -> None:
        scaling = cfg.rotary_scaling
        self.register_buffer("inv_freq", rotary_inv_freq(self.d_rope, cfg.rotary_base, scaling), persistent=False)
        self._rope = (cfg.rotary_base, scaling, rotary_attention_factor(scaling), length_dependent(scaling))
        self._rotary_key = ("rotary", self.d_rope, cfg.rotary_base, repr(scaling), cfg.rotary_adjacent_pairs)

    def _init_hooks(self) -> None:
        if self.cfg.q_lora_rank:
            self.hook_q_latent = HookPoint()  # [batch, pos, q_lora_rank]: the normalized query latent
        self.hook_q = HookPoint()  # [batch, pos, head, d_head]: [q_nope | q_rope], before rotary
        self.hook_q_nope = HookPoint()  # [batch, pos, head, d_head - rotary_dim]
        self.hook_q_rope = HookPoint()  # [batch, pos, head, rotary_dim], before rotary
        self.hook_rot_q = HookPoint()  # [batch, pos, head, d_head]: [q_nope | rotated q_rope]
        self.hook_kv_latent = HookPoint()  # [batch, pos, kv_lora_rank]: the normalized KV latent (cached)
        self.hook_k_rope = HookPoint()  # [batch, pos, rotary_dim]: the shared rotary key, before rotary
        self.hook_rot_k_rope = HookPoint()  # [batch, pos, rotary_dim]: rotated (cached)
        self.hook_k_nope = HookPoint()  # [batch, pos, head, d_head - rotary_dim]: up-projected from the latent
        self.hook_k = HookPoint()  # [batch, pos, head, d_head]: [k_nope | shared k_rope], before rotary
        self.hook_rot_k = HookPoint()  # [batch, pos, head, d_head]: [k_nope | rotated shared k_rope]
        self.hook_v = HookPoint()  # [batch, pos, head, d_value]: up-projected from the latent
        self.hook_attn_scores = HookPoint(pos_axis=2)  # [batch, head, query_pos, key_pos]
        self.hook_pattern = HookPoint(pos_axis=2)  # [batch, head, query_pos, key_pos]
        self.hook_z = HookPoint()  # [batch, pos, head, d_value]
        self.hook_result = HookPoint(requires="use_attn_result")  # [batch, pos, head, d_model]

    def use_folded_latent_norms(self) -> None:
        """After `fold_ln` folded the latent norms' gains into `W_Q_B`/`W_KV_B`: parameter-free norms."""
        if self.cfg.q_lora_rank:
            self.q_a_norm = latent_norm(self.cfg, self.cfg.q_lora_rank, folded=True)
        self.kv_a_norm = latent_norm(self.cfg, self.r, folded=True)

    # -- weight views: products of the factors (module docstring) --------------------------------
    def _gained(self, norm: nn.Module, W: torch.Tensor) -> torch.Tensor:
        """`diag(g) W` for an up-projection `W` `[head, latent, out]` read after a latent norm of gain `g`."""
        gain = getattr(norm, "w", None)  # folded (RMSPre): none
        return W if gain is None else W * gain[:, None].to(W.dtype)

    @property
    def W_Q(self) -> Float[torch.Tensor, "head d_model d_head"]:
        if not self.cfg.q_lora_rank:
            return self.W_Q_B
        return torch.einsum("dr,hre->hde", self.W_Q_A, self._gained(self.q_a_norm, self.W_Q_B))

    @property
    def b_Q(self) -> Float[torch.Tensor, "head d_head"]:
        if not self.cfg.q_lora_rank:
            return self.W_Q_B.new_zeros(self.cfg.n_heads, self.cfg.d_head)
        return torch.einsum("r,hre->he", self.b_Q_A, self._gained(self.q_a_norm, self.W_Q_B))

    def _from_latent(self, W_A: torch.Tensor, part: slice) -> torch.Tensor:
        """`W_A @ diag(g_kv) W_KV_B[..., part]` per head: `[head, d_in, part width]` (`W_A` `[d_in, r]`)."""
        return torch.einsum("dr,hre->hde", W_A, self._gained(self.kv_a_norm, self.W_KV_B)[..., part])

    def _with_shared_rope(self, nope: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        """`[nope | rope]` per head, the rotary part `rope` `[d_in, rotary_dim]` the same for every head."""
        return torch.cat([nope, rope.expand(nope.shape[0], *rope.shape)], dim=-1)

    @property
    def W_K(self) -> Float[torch.Tensor, "head d_model d_head"]:
        nope = self._from_latent(self.W_KV_A[:, : self.r], slice(0, self.d_nope))  # [head, d_model, d_nope]
        return self._with_shared_rope(nope, self.W_KV_A[:, self.r :])

    @property
    def b_K(self) -> Float[torch.Tensor, "head d_head"]:
        nope = self._from_latent(self.b_KV_A[None, : self.r], slice(0, self.d_nope))[:, 0]  # [head, d_nope]
        return self._with_shared_rope(nope, self.b_KV_A[self.r :])

    @property
    def W_V(self) -> Float[torch.Tensor, "head d_model d_value"]:
        return self._from_latent(self.W_KV_A[:, : self.r], slice(self.d_nope, None))

    @property
    def b_V(self) -> Float[torch.Tensor, "head d_value"]:
        return self._from_latent(self.b_KV_A[None, : self.r], slice(self.d_nope, None))[:, 0]

    # -- forward -----------------------------------------------------------------------------
    def forward(
        self,
        query_input: Float[torch.Tensor, "batch pos d_model"],
        key_input: torch.Tensor | None = None,
        value_input: torch.Tensor | None = None,
        state: ForwardState | None = None,
        *,
        attention_mask: Int[torch.Tensor, "batch pos"] | None = None,
    ) -> Float[torch.Tensor, "batch pos d_model"]:
        """Attend from `query_input` (MLA reads one residual stream: the key and value inputs are not used)."""
        x = query_input
        if x.ndim != 3:
            raise InputError(
                "multi-head latent attention reads one residual stream per position; per-head inputs "
                "(use_split_qkv_input, use_attn_in) are not supported: turn them off"
            )
        if state is None:
            state = ForwardState.for_input(x.shape[0], x.shape[1], x.device, attention_mask, True)
        cos, sin = self._rotary_tables(state, x.dtype)
        q_latent = self._query_latent(x)
        query = self._queries(q_latent if q_latent is not None else x, cos, sin)  # [batch, head, pos, d_head]
        latent, k_rope, rot_k_rope = self._compress(x, cos, sin)  # [batch, pos, r], 2 x [batch, pos, rotary_dim]
        key, value = self._keys_values(*self._cached(latent, rot_k_rope, state))  # [batch, head, n_keys, d]
        if self._key_hooks_observed():
            key, value = self._hook_new_keys(key, value, k_rope, (cos, sin), state.query_column_ids())
        self._before_attention(x, q_latent, cos, sin, state)
        return self._attend(query, key, value, state)

    def _before_attention(self, x, q_latent, cos, sin, state: ForwardState) -> None:
        """Sparse attention selects its keys here (`components/dsa.py`)."""

    def _rotate_rope(self, x: torch.Tensor, cos, sin) -> torch.Tensor:
        """Rotate `[..., head, rotary_dim]`: DeepSeek-V3's interleaved pairs, or `Attention`'s pairing."""
        if self.cfg.rotary_interleaved_input:
            return apply_rotary_interleaved(x, cos, sin)
        return self._rotate(x, cos, sin)

    def _query_latent(self, x: Float[torch.Tensor, "batch pos d_model"]) -> torch.Tensor | None:
        if not self.cfg.q_lora_rank:
            return None
        compressed = F.linear(x, self.W_Q_A.t(), self.b_Q_A)  # [batch, pos, q_lora_rank]
        return self.hook_q_latent(self.q_a_norm(compressed))

    def _queries(self, q_in: torch.Tensor, cos, sin) -> Float[torch.Tensor, "batch head pos d_head"]:
        """`[q_nope | rot(q_rope)]` through the query hooks, laid out heads first as HF's (bit for bit below fp32)."""
        q = self.hook_q(up_project(q_in, self.W_Q_B))  # [batch, pos, head, d_head]
        q_nope = self.hook_q_nope(q[..., : self.d_nope])  # [batch, pos, head, d_nope]
        q_rope = self.hook_q_rope(q[..., self.d_nope :])  # [batch, pos, head, rotary_dim]
        rotated = self._rotate_rope(q_rope, cos, sin)
        query = torch.cat([q_nope.transpose(1, 2), rotated.transpose(1, 2)], dim=-1)  # [batch, head, pos, d_head]
        return self.hook_rot_q(query.transpose(1, 2)).transpose(1, 2)

    def _compress(self, x: torch.Tensor, cos, sin) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The new positions' normalized KV latent, shared key and rotated shared key (the cache stores the first
        and the last)."""
        compressed = F.linear(x, self.W_KV_A.t(), self.b_KV_A)  # [batch, pos, r + rotary_dim]
        latent = self.hook_kv_latent(self.kv_a_norm(compressed[..., : self.r]))  # [batch, pos, r]
        k_rope = self.hook_k_rope(compressed[..., self.r :])  # [batch, pos, rotary_dim]
        rotated = self._rotate_rope(k_rope[:, :, None], cos, sin)[:, :, 0]  # one head, shared by all
        return latent, k_rope, self.hook_rot_k_rope(rotated)

    def _cached(self, latent: torch.Tensor, rot_k_rope: torch.Tensor, state: ForwardState):
        """With a KV cache: store the new latents and shared keys, return every position's `[batch, n_keys, ...]`."""
        if state.past_kv_cache is None:
            return latent, rot_k_rope
        entry = state.past_kv_cache[self.layer]
        columns = () if state.query_columns is None else (state.query_columns,)  # a static cache writes at columns
        latent, rot_k_rope = entry.update(latent[:, :, None], rot_k_rope[:, :, None], *columns)  # one "head" each
        return latent[:, :, 0], rot_k_rope[:, :, 0]

    def _keys_values(
        self, latent: Float[torch.Tensor, "batch n_keys r"], rot_k_rope: Float[torch.Tensor, "batch n_keys rot"]
    ) -> tuple[Float[torch.Tensor, "batch head n_keys d_head"], Float[torch.Tensor, "batch head n_keys d_value"]]:
        """Every head's keys and values, up-projected from the latent of every key position, laid out as HF's."""
        kv = up_project(latent, self.W_KV_B).transpose(1, 2)  # [batch, head, n_keys, dk+dv]
        key = kv.new_empty(*kv.shape[:-1], self.d_nope + self.d_rope)  # [batch, head, n_keys, d_head]
        key[..., : self.d_nope].copy_(kv[..., : self.d_nope])
        key[..., self.d_nope :].copy_(rot_k_rope[:, None])  # the shared key, every head
        return key, kv[..., self.d_nope :]

    def _key_hooks_observed(self) -> bool:
        return any(h.observed for h in (self.hook_k_nope, self.hook_k, self.hook_rot_k, self.hook_v))

    def _hook_new_keys(self, key, value, k_rope, tables, columns) -> tuple[torch.Tensor, torch.Tensor]:
        """Run the per-head key and value hooks on the new positions (key `columns`) and use what they return.

        `k_rope` is the new positions' unrotated shared key; an edit of `hook_k` is rotated like the original.
        """
        new_key = key.index_select(2, columns).transpose(1, 2)  # [batch, pos, head, d_head], rotated
        k_nope = self.hook_k_nope(new_key[..., : self.d_nope])  # [batch, pos, head, d_nope]
        rot_k_rope = new_key[..., self.d_nope :]  # [batch, pos, head, rotary_dim]
        if self.hook_k.observed:
            shared = k_rope[:, :, None].expand(*k_nope.shape[:3], self.d_rope)  # [batch, pos, head, rotary_dim]
            k = self.hook_k(torch.cat([k_nope, shared], dim=-1))  # [batch, pos, head, d_head], before rotary
            if not self.hook_k.is_read_only:
                k_nope, rot_k_rope = k[..., : self.d_nope], self._rotate_rope(k[..., self.d_nope :], *tables)
        rot_k = self.hook_rot_k(torch.cat([k_nope, rot_k_rope], dim=-1))  # [batch, pos, head, d_head]
        new_value = value.index_select(2, columns).transpose(1, 2)  # [batch, pos, head, d_value]
        v = self.hook_v(new_value)
        if torch.equal(rot_k, new_key) and torch.equal(v, new_value):  # unedited: keep HF's layouts (bit for bit)
            return key, value
        key = key.index_copy(2, columns, rot_k.transpose(1, 2).to(key.dtype))
        return key, value.index_copy(2, columns, v.transpose(1, 2).to(value.dtype))

    def _attend(self, query, key, value, state: ForwardState) -> Float[torch.Tensor, "batch pos d_model"]:
        """`Attention`'s SDPA or explicit path on heads-first q, k, v; then `hook_z` and the output projection."""
        q, k, v = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)  # [batch, pos, head, d]
        if self._use_sdpa():
            z = self._attend_sdpa(q, k, v, state)
            if self._pattern_observed():  # read-only observers (caching): the explicit pattern beside it
                self._pattern(query, key, value.dtype, state)
        else:
            z = torch.matmul(self._pattern(query, key, value.dtype, state), value)  # [batch, head, pos, d_value]
        return self._output(self.hook_z(z.transpose(1, 2)))  # z: [batch, pos, head, d_value]
