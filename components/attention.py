"""Multi-head and grouped-query causal self-attention with a hook on every intermediate.

Two paths compute the same thing. The explicit path materialises `attn_scores` and
`pattern` (softmax in float32, HF eager semantics); the fast path calls
`scaled_dot_product_attention`. `attn_implementation="auto"` takes the fast path while no
hook can change `hook_attn_scores` or `hook_pattern`: a hook that may edit a pattern switches
that layer to the explicit path for that call only, while caching (read-only hooks) keeps the
fast path's output and computes the pattern beside it, so `run_with_cache` returns the very
logits of a plain forward.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from jaxtyping import Float, Int

from hooked.components import alibi
from hooked.components.alibi import alibi_bias, alibi_sdpa_mask, alibi_slopes
from hooked.components.attention_buffers import AttentionBuffers
from hooked.components.forward_state import ForwardState
from hooked.components.qk_norm import apply_qk_norm, make_qk_norm
from hooked.components.rotary import (
    apply_rotary,
    layer_rotary_parameters,
    length_dependent,
    rope_kind,
    rotary_attention_factor,
    rotary_cos_sin,
    rotary_inv_freq,
)
from hooked.core.config import HookedTransformerConfig
from hooked.core.hook_points import HookPoint
from hooked.core.validation import require_set


def head_major(n_heads: int, d_in: int, d_out: int, dtype) -> torch.Tensor:
    """An empty `[n_heads, d_in, d_out]` tensor stored as `[d_in, n_heads, d_out]`.

    The TransformerLens shape, laid out so `W.permute(1, 0, 2).reshape(d_in, -1)` is a
    free view and the projection of all heads is one matmul, as in HuggingFace.
    """
    return torch.empty(d_in, n_heads, d_out, dtype=dtype).permute(1, 0, 2)


def project(
    x: Float[torch.Tensor, "batch pos d_model"] | Float[torch.Tensor, "batch pos head d_model"],
    W: Float[torch.Tensor, "head d_model d_head"],
    b: Float[torch.Tensor, "head d_head"],
    bias_after: bool = False,
) -> Float[torch.Tensor, "batch pos head d_head"]:
    """`x @ W[h] + b[h]` for every head h; x is shared by all heads, or has one copy per head.

    `bias_after` (Falcon): the product, then the bias added, as two ops, as HF's `FalconLinear`.
    """
    n_heads, d_model, d_head = W.shape
    if x.ndim == 4:  # split-input mode: [batch, pos, head, d_model]
        return torch.einsum("bphd,hde->bphe", x, W) + b
    # W.transpose(1, 2).reshape(...) is a free view of the head-major storage: [head * d_head, d_model]
    W_flat = W.transpose(1, 2).reshape(n_heads * d_head, d_model)
    # [batch, pos, head * d_head]
    flat = F.linear(x, W_flat) + b.reshape(-1) if bias_after else F.linear(x, W_flat, b.reshape(-1))
    return flat.view(*x.shape[:-1], n_heads, d_head)  # [batch, pos, head, d_head]


#: `scaled_dot_product_attention(..., enable_gqa=True)` exists from torch 2.5
SDPA_HAS_GQA = "enable_gqa" in (F.scaled_dot_product_attention.__doc__ or "")


class Attention(AttentionBuffers, nn.Module):
    """Multi-head attention; `GroupedQueryAttention` shares K/V weights across query heads.

    TransformerLens's `mask`, `IGNORE`, `rotary_sin` and `rotary_cos` buffers are built on first
    read and may be assigned (`AttentionBuffers`); `attn_type` is `"global"` or `"local"`.
    """

    # TransformerLens's static ALiBi helpers (hooked's layers use `components.alibi` per forward)
    create_alibi_slope = staticmethod(alibi.create_alibi_slope)
    create_alibi_multipliers = staticmethod(alibi.create_alibi_multipliers)
    create_alibi_bias = staticmethod(alibi.create_alibi_bias)

    def __init__(self, cfg: HookedTransformerConfig | dict, layer: int = 0):
        super().__init__()
        cfg = HookedTransformerConfig.unwrap(cfg)
        self.cfg, self.layer = cfg, layer
        H, d, dh, dt = cfg.n_heads, cfg.d_model, cfg.d_head, cfg.dtype
        self.W_Q = nn.Parameter(head_major(H, d, dh, dt))
        self.b_Q = nn.Parameter(torch.zeros(H, dh, dtype=dt))
        self._init_kv(cfg)
        self.W_O = nn.Parameter(torch.empty(H, dh, d, dtype=dt))
        self.b_O = nn.Parameter(torch.zeros(d, dtype=dt))
        scale = cfg.attn_scale * (layer + 1 if cfg.scale_attn_by_inverse_layer_idx else 1)
        self.scale, self.divisor = 1.0 / scale, scale
        self.attn_type = cfg.attn_types_or_global[layer]  # "global" or "local" (sliding window)
        is_local = self.attn_type == "local"
        self.window = cfg.window_size if is_local else None
        if cfg.use_qk_norm:  # per head, or over the whole projection (OLMo-2/3, OLMoE)
            self.q_norm, self.k_norm = make_qk_norm(cfg, H), make_qk_norm(cfg, cfg.n_kv_heads)
        # fp32 slopes as a plain attribute (not a buffer), so casting the model never rounds them
        self.alibi_slopes = alibi_slopes(H) if cfg.positional_embedding_type == "alibi" else None
        if self.alibi_slopes is not None and cfg.alibi_before_attn_scale:  # Falcon: (q.k + bias) / attn_scale
            self.alibi_slopes = self.alibi_slopes * self.scale
        if cfg.attn_sinks:  # GPT-OSS: one learned logit per head joins each softmax, then is dropped
            self.sinks = nn.Parameter(torch.zeros(H, dtype=cfg.dtype))
        # NoPE layers (SmolLM3, Cohere2) rotate nothing: no rotary, no hook_rot_q/hook_rot_k
        self.rotary = cfg.uses_rotary and layer not in (cfg.nope_layers or ())
        if self.rotary:
            base, scaling = layer_rotary_parameters(cfg, is_local)
            inv_freq = rotary_inv_freq(require_set(cfg.rotary_dim, "rotary_dim"), base, scaling)
            # layers with the same frequencies share one cos/sin table per forward
            self._rotary_key = ("rotary", cfg.rotary_dim, base, repr(scaling), cfg.rotary_adjacent_pairs)
            self.register_buffer("inv_freq", inv_freq, persistent=False)
            self._rope = (base, scaling, rotary_attention_factor(scaling), length_dependent(scaling))
            self.hook_rot_q = HookPoint()  # [batch, pos, head, d_head]
            self.hook_rot_k = HookPoint()  # [batch, pos, kv_head, d_head]
        self.hook_q = HookPoint()  # [batch, pos, head, d_head]
        self.hook_k = HookPoint()  # [batch, pos, kv_head, d_head]
        self.hook_v = HookPoint()  # [batch, pos, kv_head, d_head]
        self.hook_attn_scores = HookPoint(pos_axis=2)  # [batch, head, query_pos, key_pos]
        self.hook_pattern = HookPoint(pos_axis=2)  # [batch, head, query_pos, key_pos]
        self.hook_z = HookPoint()  # [batch, pos, head, d_head]
        self.hook_result = HookPoint(requires="use_attn_result")  # [batch, pos, head, d_model]
        self._init_attention_buffers()

    def _init_kv(self, cfg: HookedTransformerConfig) -> None:
        H, d, dh, dt = cfg.n_heads, cfg.d_model, cfg.d_head, cfg.dtype
        self.W_K, self.W_V = nn.Parameter(head_major(H, d, dh, dt)), nn.Parameter(head_major(H, d, dh, dt))
        self.b_K, self.b_V = nn.Parameter(torch.zeros(H, dh, dtype=dt)), nn.Parameter(torch.zeros(H, dh, dtype=dt))

    def kv_weights(self, n_heads: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """`(W_K, b_K, W_V, b_V)` with `n_heads` heads."""
        return self.W_K, self.b_K, self.W_V, self.b_V

    def ungroup(self, x: Float[torch.Tensor, "batch pos kv_head d_head"]) -> torch.Tensor:
        """Repeat key/value heads up to `n_heads` (identity for multi-head attention)."""
        return x

    @property
    def QK(self):
        from hooked.core.factored_matrix import FactoredMatrix

        return FactoredMatrix(self.W_Q, self.W_K.transpose(-2, -1))

    @property
    def OV(self):
        from hooked.core.factored_matrix import FactoredMatrix

        return FactoredMatrix(self.W_V, self.W_O)

    def forward(
        self,
        query_input: Float[torch.Tensor, "batch pos d_model"] | Float[torch.Tensor, "batch pos head d_model"],
        key_input: torch.Tensor,
        value_input: torch.Tensor,
        state: ForwardState | None = None,
        *,
        attention_mask: Int[torch.Tensor, "batch pos"] | None = None,
    ) -> Float[torch.Tensor, "batch pos d_model"]:
        """Attend; `state` is the model's (called alone, TransformerLens-style, it is built from the input)."""
        cfg = self.cfg
        if state is None:
            causal = cfg.attention_dir == "causal"
            state = ForwardState.for_input(
                query_input.shape[0], query_input.shape[1], query_input.device, attention_mask, causal
            )
        kv_heads = key_input.shape[2] if key_input.ndim == 4 else cfg.n_kv_heads
        W_K, b_K, W_V, b_V = self.kv_weights(kv_heads)
        after = cfg.bias_after_matmul
        q = self.hook_q(project(query_input, self.W_Q, self.b_Q, after))  # [batch, pos, head, d_head]
        k = project(key_input, W_K, b_K, after)  # [batch, pos, kv_head, d_head]
        v = project(value_input, W_V, b_V, after)  # [batch, pos, kv_head, d_head]
        if cfg.ungroup_grouped_query_attention:
            k, v = self.ungroup(k), self.ungroup(v)
        k, v = self.hook_k(k), self.hook_v(v)
        if cfg.use_qk_norm:
            q, k = apply_qk_norm(self.q_norm, q), apply_qk_norm(self.k_norm, k)
        if cfg.clip_qkv is not None:  # after the qk-norm, as OLMoE (OLMo-1 has no qk-norm)
            q, k, v = (t.clamp(-cfg.clip_qkv, cfg.clip_qkv) for t in (q, k, v))
        if self.rotary:
            cos, sin = self._rotary_tables(state, q.dtype)
            q, k = self.hook_rot_q(self._rotate(q, cos, sin)), self.hook_rot_k(self._rotate(k, cos, sin))
        if state.past_kv_cache is not None:
            entry = state.past_kv_cache[self.layer]
            if state.query_columns is None:
                k, v = entry.update(k, v)  # [batch, n_keys, kv_head, d_head]
            else:  # a static cache: written at fixed columns, read whole
                k, v = entry.update(k, v, state.query_columns)  # [batch, capacity, kv_head, d_head]
        if self._use_sdpa():
            z = self._attend_sdpa(q, k, v, state)
            if self._pattern_observed():  # read-only observers (caching): give them the explicit pattern
                self._pattern(*self._heads_first(q, k, v)[:2], v.dtype, state)
        else:
            q, k, v = self._heads_first(q, k, v)
            z = torch.matmul(self._pattern(q, k, v.dtype, state), v)  # [batch, head, pos, d_head]
        z = self.hook_z(self._gate_z(z.transpose(1, 2), query_input))  # [batch, pos, head, d_head]
        return self._output(z)

    def _rotary_tables(self, state: ForwardState, q_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """`(cos, sin)` for this forward's positions: the model's own, TransformerLens's stored, or built once."""
        table_dtype = torch.float32 if self.cfg.rotary_tables_in_fp32 else q_dtype
        if state.rotary_tables is not None:  # tables the model built (Qwen2.5-VL's 2-D and 3-D rotary)
            return state.rotary_tables
        if "rotary_cos" in self._buffers or "rotary_sin" in self._buffers:  # assigned or read TL tables
            return self._stored_cos_sin(state, table_dtype)
        return state.memo(self._rotary_key, lambda: self._cos_sin(state, table_dtype))

    def _gate_z(self, z: Float[torch.Tensor, "batch pos head d_head"], query_input: torch.Tensor) -> torch.Tensor:
        """`z` as `W_O` reads it (`GatedAttention`, Qwen3-Next: times a per-head gate of the input)."""
        return z

    def _rotate(self, x: Float[torch.Tensor, "batch pos head d_head"], cos, sin) -> torch.Tensor:
        """Rotary on q or k; with `cfg.rotary_in_fp32` (Cohere, OLMo) in float32 with the tables as given, cast back."""
        adjacent = self.cfg.rotary_adjacent_pairs
        if self.cfg.rotary_in_fp32 and x.dtype != torch.float32:
            return apply_rotary(x.float(), cos.float(), sin.float(), adjacent).to(x.dtype)
        return apply_rotary(x, cos, sin, adjacent)

    def _cos_sin(self, state: ForwardState, dtype):
        base, scaling, attention_factor, by_length = self._rope
        inv_freq = self.inv_freq
        if by_length and torch.compiler.is_compiling() and rope_kind(scaling) == "longrope":
            inv_freq = self._longrope_inv_freq_on_device(state, base, scaling)
        elif by_length:  # dynamic NTK / LongRoPE: frequencies from this call's total length, as HF
            seq_len = int(state.positions.max()) + 1
            rotary_dim = require_set(self.cfg.rotary_dim, "rotary_dim")
            inv_freq = rotary_inv_freq(rotary_dim, base, scaling, seq_len).to(inv_freq.device)
        return rotary_cos_sin(state.positions, inv_freq, self.cfg.rotary_adjacent_pairs, dtype, attention_factor)

    def _longrope_inv_freq_on_device(self, state: ForwardState, base: float, scaling: dict) -> torch.Tensor:
        """LongRoPE's short or long frequencies, chosen on the device (no host sync under `torch.compile`)."""
        original = scaling["original_max_position_embeddings"]
        rotary_dim = require_set(self.cfg.rotary_dim, "rotary_dim")
        short = rotary_inv_freq(rotary_dim, base, scaling, original)
        long = rotary_inv_freq(rotary_dim, base, scaling, original + 1)
        use_long = state.positions.max() + 1 > original  # 0-d bool tensor
        return torch.where(use_long, long.to(self.inv_freq.device), short.to(self.inv_freq.device))

    def _use_sdpa(self) -> bool:
        """Whether the output may come from SDPA: nothing can edit the scores or the pattern."""
        return (
            self.cfg.attn_implementation == "auto"
            and self.cfg.attn_scores_soft_cap <= 0
            and not self.cfg.attn_sinks
            and self.hook_attn_scores.is_read_only
            and self.hook_pattern.is_read_only
            and not self._stored_masking()
        )

    def _pattern_observed(self) -> bool:
        return self.hook_attn_scores.observed or self.hook_pattern.observed

    def _heads_first(self, q, k, v) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """`[batch, head, pos, d_head]` q, k, v for the attention matmuls, K/V repeated up to `n_heads`.

        K/V are repeated after the transpose, as HF's `repeat_kv`: half-precision CPU matmuls
        round differently for differently strided inputs, so the layouts must be HF's too.
        """
        k, v = k.transpose(1, 2), v.transpose(1, 2)  # [batch, kv_head, n_keys, d_head]
        if k.shape[1] != q.shape[2]:
            batch, kv_heads, n_keys, d_head = k.shape
            shape = (batch, kv_heads, q.shape[2] // kv_heads, n_keys, d_head)  # [batch, kv_head, group, key, d_head]
            k = k[:, :, None].expand(shape).reshape(batch, -1, n_keys, d_head)  # [batch, head, n_keys, d_head]
            v = v[:, :, None].expand(shape).reshape(batch, -1, n_keys, d_head)
        return q.transpose(1, 2), k, v

    def _attend_sdpa(
        self,
        q: Float[torch.Tensor, "batch pos head d_head"],
        k: Float[torch.Tensor, "batch n_keys kv_head d_head"],
        v: Float[torch.Tensor, "batch n_keys kv_head d_value"],
        state: ForwardState,
    ) -> Float[torch.Tensor, "batch head pos d_value"]:
        mask, is_causal = self._sdpa_mask(state)
        if self.alibi_slopes is not None:  # the bias rides in a float mask, -inf where masked
            mask, is_causal = alibi_sdpa_mask(state, self.alibi_slopes, self.window, q.dtype), False
        batch, n_queries, n_heads, d_head = q.shape
        kv_heads = k.shape[2]
        grouped_kv = kv_heads != n_heads and self.alibi_slopes is None
        if grouped_kv and mask is None and d_head == v.shape[-1] <= 256 and SDPA_HAS_GQA:
            # HF's choice (`use_gqa_in_sdpa`): without a mask SDPA reads the shared K/V heads itself;
            # the same call as HF's, so the same kernel and the same rounding
            z = F.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=is_causal, scale=self.scale,
                enable_gqa=True,
            )  # fmt: skip
        elif grouped_kv and n_queries == 1:
            # Decoding one token with GQA: the query heads sharing a K/V head act as that head's
            # queries (their mask row is the same), so K/V are never repeated, as in HF (`pack_gqa`).
            grouped = q.reshape(batch, kv_heads, n_heads // kv_heads, d_head)  # [batch, kv_head, group, d_head]
            z = F.scaled_dot_product_attention(
                grouped, k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask, scale=self.scale
            )
            z = z.reshape(batch, n_heads, 1, d_head)  # [batch, head, 1, d_head]
        else:
            q, k, v = self._heads_first(q, k, v)
            z = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal, scale=self.scale)
        valid = state.valid_queries(self.window)
        return z if valid is None else torch.where(valid, z, 0.0)

    def _allowed(self, state: ForwardState) -> torch.Tensor | None:
        """Which keys each query may attend to, `[batch or 1, 1, q, k]` (None: all); sparse attention narrows it."""
        return state.allowed(self.window)

    def _sdpa_mask(self, state: ForwardState) -> tuple[torch.Tensor | None, bool]:
        """`(attn_mask, is_causal)` for SDPA, the same keys as `_allowed`."""
        return state.sdpa_mask(self.window)

    def _pattern(self, q, k, dtype: torch.dtype, state: ForwardState) -> Float[torch.Tensor, "batch head q_pos k_pos"]:
        """Scores and softmax pattern through their hooks, from `[batch, head, pos, d_head]` q and k.

        With `cfg.attn_scores_in_fp32` (GPT-J, GPT-Neo) q and k are cast to float32 before their
        product, as HF's eager attention for those families: `hook_attn_scores` is then float32
        in a half-precision model (the pattern is still cast back to the model dtype).
        """
        if self.cfg.attn_scores_in_fp32:
            q, k = q.float(), k.float()
        if self.alibi_slopes is not None and not self.cfg.alibi_before_attn_scale:
            scores = self._alibi_scores(q, k, state)
        else:
            scores = torch.matmul(q, k.transpose(-1, -2))  # [batch, head, q_pos, k_pos]
            scores = scores / self.divisor if self.cfg.attn_scale_divides else scores * self.scale
        if self.alibi_slopes is not None and self.cfg.alibi_before_attn_scale:
            scores = scores + alibi_bias(state, self.alibi_slopes, scores.dtype)  # [batch, head, 1, k_pos] bias
        if self.cfg.attn_scores_soft_cap > 0:
            cap = self.cfg.attn_scores_soft_cap
            scores = cap * torch.tanh(scores / cap)
        stored = self._stored_masking()  # TransformerLens's mask / IGNORE buffers, read or assigned
        allowed = self._stored_allowed(state) if stored else self._allowed(state)
        if allowed is not None:
            scores = scores.masked_fill(~allowed, self._ignore_value())
        scores = self.hook_attn_scores(scores)
        pattern = torch.softmax(scores.float(), dim=-1) if not self.cfg.attn_sinks else self._softmax_with_sinks(scores)
        if stored:
            valid = None if allowed is None else allowed.any(-1, keepdim=True)  # [batch or 1, 1, q, 1]
        else:
            valid = state.valid_queries(self.window)
        if valid is not None:  # rows with no visible key are 0, not NaN
            pattern = torch.where(valid, pattern, 0.0)
        return self.hook_pattern(pattern.to(dtype))  # [batch, head, q_pos, k_pos]

    def _alibi_scores(self, q, k, state: ForwardState) -> Float[torch.Tensor, "batch head q_pos k_pos"]:
        """`bias + scale * q.k` in one `baddbmm`, as HF's Bloom: one rounding in half precision, not three."""
        batch, n_heads, n_queries, d_head = q.shape
        assert self.alibi_slopes is not None  # called for ALiBi layers only
        bias = alibi_bias(state, self.alibi_slopes, q.dtype)  # [batch or 1, head, 1, k_pos]
        bias = bias.expand(batch, n_heads, 1, k.shape[-2]).reshape(batch * n_heads, 1, -1)  # [batch * head, 1, k_pos]
        flat_q = q.reshape(batch * n_heads, n_queries, d_head)  # [batch * head, q_pos, d_head]
        flat_k = k.reshape(batch * n_heads, -1, d_head)  # [batch * head, k_pos, d_head]
        scores = torch.baddbmm(bias, flat_q, flat_k.transpose(1, 2), alpha=self.scale)  # [batch * head, q_pos, k_pos]
        return scores.view(batch, n_heads, n_queries, -1)  # [batch, head, q_pos, k_pos]

    def _softmax_with_sinks(self, scores: Float[torch.Tensor, "batch head q_pos k_pos"]) -> torch.Tensor:
        """Softmax over the keys plus one sink logit per head, sink column dropped: rows sum to less than 1.

        As HF's GPT-OSS: in the scores' dtype, after subtracting each row's max (its overflow guard).
        """
        sinks = self.sinks.to(scores.dtype)[None, :, None, None].expand(*scores.shape[:-1], 1)  # [batch, head, q, 1]
        logits = torch.cat([scores, sinks], dim=-1)  # [batch, head, q_pos, k_pos + 1]
        logits = logits - logits.max(dim=-1, keepdim=True).values
        return torch.softmax(logits, dim=-1, dtype=logits.dtype)[..., :-1]

    def _output(self, z: Float[torch.Tensor, "batch pos head d_head"]) -> Float[torch.Tensor, "batch pos d_model"]:
        if self.cfg.use_attn_result:
            result = self.hook_result(torch.einsum("bphe,hed->bphd", z, self.W_O))  # [batch, pos, head, d_model]
            return result.sum(-2) + self.b_O
        z_flat, W_flat = z.reshape(-1, z.shape[-2] * z.shape[-1]), self.W_O.reshape(-1, self.W_O.shape[-1])
        if self.cfg.bias_after_matmul:  # Falcon: product, then bias
            flat = torch.mm(z_flat, W_flat) + self.b_O
        else:
            flat = torch.addmm(self.b_O, z_flat, W_flat)
        return flat.view(*z.shape[:2], -1)  # [batch, pos, d_model]


class GroupedQueryAttention(Attention):
    """Attention whose `n_key_value_heads` K/V heads are each shared by a group of query heads.

    K/V weights are stored at `n_key_value_heads` (`_W_K`, `_W_V`, `_b_K`, `_b_V`);
    the `W_K`/`W_V`/`b_K`/`b_V` properties repeat them up to `n_heads`.
    """

    def _init_kv(self, cfg: HookedTransformerConfig) -> None:
        Hkv, d, dh, dt = require_set(cfg.n_key_value_heads, "n_key_value_heads"), cfg.d_model, cfg.d_head, cfg.dtype
        self.repeats = cfg.n_heads // Hkv
        self._W_K, self._W_V = nn.Parameter(head_major(Hkv, d, dh, dt)), nn.Parameter(head_major(Hkv, d, dh, dt))
        self._b_K, self._b_V = (
            nn.Parameter(torch.zeros(Hkv, dh, dtype=dt)),
            nn.Parameter(torch.zeros(Hkv, dh, dtype=dt)),
        )

    W_K = property(lambda self: self._W_K.repeat_interleave(self.repeats, dim=0))
    W_V = property(lambda self: self._W_V.repeat_interleave(self.repeats, dim=0))
    b_K = property(lambda self: self._b_K.repeat_interleave(self.repeats, dim=0))
    b_V = property(lambda self: self._b_V.repeat_interleave(self.repeats, dim=0))

    def kv_weights(self, n_heads: int):
        if n_heads == self.cfg.n_heads:
            return self.W_K, self.b_K, self.W_V, self.b_V
        return self._W_K, self._b_K, self._W_V, self._b_V

    def ungroup(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[2] == self.cfg.n_heads:
            return x
        return x.repeat_interleave(self.repeats, dim=2)
