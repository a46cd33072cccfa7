"""T5's pieces: relative position buckets, unscaled attention with a learned bias, and its blocks.

T5 has no position embedding: the first self-attention layer of the encoder (and of the
decoder) owns a table `rel_pos_bias [num_buckets, n_heads]`, and the bias it looks up from
the bucketed distance `key_pos - query_pos` is added to the scores of every layer of that
stack. Scores are not scaled by `1/sqrt(d_head)`. Norms are RMSNorm (no centering, fp32
statistics), which `components.norms.RMSNorm` computes exactly.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from jaxtyping import Float, Int

from hooked.components.attention import Attention, project
from hooked.components.mlp import MLP, GatedMLP
from hooked.components.norms import RMSNorm
from hooked.core.config import HookedTransformerConfig
from hooked.core.hook_points import HookPoint


def relative_position_bucket(
    relative_position: Int[torch.Tensor, "query_pos kv_pos"],
    bidirectional: bool = True,
    num_buckets: int = 32,
    max_distance: int = 128,
) -> Int[torch.Tensor, "query_pos kv_pos"]:
    """The bucket of each distance `key - query`, as Mesh TensorFlow and HF's T5 compute it.

    Half the buckets hold exact small distances, the other half logarithmically wider ranges
    up to `max_distance`. Bidirectional (encoder) buckets split by the sign of the distance;
    unidirectional (decoder) ones only count keys before the query.
    """
    buckets = torch.zeros_like(relative_position)
    if bidirectional:
        num_buckets //= 2
        buckets += (relative_position > 0).to(torch.long) * num_buckets
        relative_position = torch.abs(relative_position)
    else:
        relative_position = -torch.min(relative_position, torch.zeros_like(relative_position))
    max_exact = num_buckets // 2
    is_small = relative_position < max_exact
    large = max_exact + (
        torch.log(relative_position.float() / max_exact)
        / math.log(max_distance / max_exact)
        * (num_buckets - max_exact)
    ).to(torch.long)
    large = torch.min(large, torch.full_like(large, num_buckets - 1))
    return buckets + torch.where(is_small, relative_position, large)


def relative_position_bias(
    table: Float[torch.Tensor, "num_buckets head"],
    query_positions: Int[torch.Tensor, "query_pos"],
    key_positions: Int[torch.Tensor, "kv_pos"],
    bidirectional: bool,
    max_distance: int,
) -> Float[torch.Tensor, "1 head query_pos kv_pos"]:
    """The learned bias added to the scores of every layer: `table[bucket(key - query)]`."""
    relative = key_positions[None, :] - query_positions[:, None]  # [query_pos, kv_pos]
    buckets = relative_position_bucket(relative, bidirectional, table.shape[0], max_distance)
    return F.embedding(buckets, table).permute(2, 0, 1).unsqueeze(0)  # [1, head, query_pos, kv_pos]


class T5Attention(Attention):
    """Self- or cross-attention without score scaling, plus the relative position bias.

    Called TransformerLens-style: `attn(q_in, k_in, v_in, position_bias=...)`, with an optional
    additive padding mask over the keys. Decoder self-attention is causal even when called
    alone (as HF's default SDPA attention; HF's eager one is causal only through the mask its
    stack builds); with a `past_kv_cache_entry` the new queries come after the cached keys. Cross-attention can
    take precomputed `key_value` (the encoder's keys and values, computed once per prompt).
    """

    def __init__(
        self,
        cfg: HookedTransformerConfig | dict,
        has_relative_attention_bias: bool = False,
        is_decoder: bool = False,
        is_cross_attention: bool = False,
    ):
        cfg = HookedTransformerConfig.unwrap(cfg)
        super().__init__(cfg, 0)
        self.scale = 1.0  # T5 folds 1/sqrt(d_head) into its initialisation, never into the scores
        self.is_decoder, self.is_cross_attention = is_decoder, is_cross_attention
        self.causal = is_decoder and not is_cross_attention
        self.has_relative_attention_bias = has_relative_attention_bias
        if has_relative_attention_bias:
            if cfg.relative_attention_num_buckets is None or cfg.relative_attention_max_distance is None:
                raise ValueError(
                    "A T5 attention layer with a relative bias needs relative_attention_num_buckets and "
                    "relative_attention_max_distance in its config"
                )
            self.relative_attention_num_buckets = cfg.relative_attention_num_buckets
            self.relative_attention_max_distance = cfg.relative_attention_max_distance
            self.rel_pos_bias = nn.Embedding(cfg.relative_attention_num_buckets, cfg.n_heads, dtype=cfg.dtype)
            self.rel_pos_hook = HookPoint(pos_axis=2)  # [1, head, query_pos, kv_pos]

    def compute_relative_attention_bias(
        self, query_length: int, key_length: int, device=None, past_length: int = 0
    ) -> Float[torch.Tensor, "1 head query_pos kv_pos"]:
        """The bias of queries `past_length .. past_length + query_length` over keys `0 .. key_length`.

        Encoder buckets are bidirectional, decoder ones unidirectional (as HF; TransformerLens
        2.18 uses bidirectional buckets in the decoder too).
        """
        device = self.rel_pos_bias.weight.device if device is None else device
        queries = torch.arange(past_length, past_length + query_length, dtype=torch.long, device=device)
        keys = torch.arange(key_length, dtype=torch.long, device=device)
        bias = relative_position_bias(
            self.rel_pos_bias.weight, queries, keys, not self.is_decoder, self.relative_attention_max_distance
        )
        return self.rel_pos_hook(bias)  # [1, head, query_pos, kv_pos]

    def project_kv(
        self, key_input: Float[torch.Tensor, "batch kv_pos *head d_model"], value_input: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Hooked keys and values `[batch, kv_pos, head, d_head]` (computed once for cross-attention)."""
        value_input = key_input if value_input is None else value_input
        k = self.hook_k(project(key_input, self.W_K, self.b_K))  # [batch, kv_pos, head, d_head]
        v = self.hook_v(project(value_input, self.W_V, self.b_V))  # [batch, kv_pos, head, d_head]
        return k, v

    def forward(
        self,
        query_input: Float[torch.Tensor, "batch pos d_model"] | Float[torch.Tensor, "batch pos head d_model"],
        key_input: torch.Tensor | None = None,
        value_input: torch.Tensor | None = None,
        past_kv_cache_entry=None,
        additive_attention_mask: Float[torch.Tensor, "batch 1 1 kv_pos"] | None = None,
        position_bias: Float[torch.Tensor, "1 head pos kv_pos"] | None = None,
        key_value: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> Float[torch.Tensor, "batch pos d_model"]:
        if position_bias is None and self.has_relative_attention_bias:
            raise ValueError(
                "This layer owns the relative bias: pass position_bias=attn.compute_relative_attention_bias(...)"
            )
        q = self.hook_q(project(query_input, self.W_Q, self.b_Q))  # [batch, pos, head, d_head]
        if key_value is None:
            if key_input is None:
                raise ValueError("pass key_input (the stream the keys come from), or key_value from project_kv")
            key_value = self.project_kv(key_input, value_input)
        k, v = key_value
        offset = 0
        if past_kv_cache_entry is not None:
            offset = past_kv_cache_entry.length
            k, v = past_kv_cache_entry.update(k, v)  # [batch, kv_pos, head, d_head]
        mask = self._mask(q.shape[1], k.shape[1], offset, position_bias, additive_attention_mask, q)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [batch, head, pos, d_head]
        if self._use_sdpa():
            z = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=1.0)
            if self._pattern_observed():  # read-only observers (caching)
                self._t5_pattern(q, k, mask, v.dtype)
        else:
            z = torch.matmul(self._t5_pattern(q, k, mask, v.dtype), v)  # [batch, head, pos, d_head]
        z = self.hook_z(z.transpose(1, 2))  # [batch, pos, head, d_head]
        return self._output(z)

    def _t5_pattern(self, q, k, mask, dtype: torch.dtype) -> Float[torch.Tensor, "batch head q_pos k_pos"]:
        """Unscaled scores plus the bias/padding/causal mask, softmax, through their hooks."""
        scores = self.hook_attn_scores(torch.matmul(q, k.transpose(-1, -2)) + mask)  # [batch, head, q_pos, k_pos]
        pattern = torch.softmax(scores.float(), dim=-1)
        pattern = torch.nan_to_num(pattern, nan=0.0)  # a row with no visible key attends to nothing
        return self.hook_pattern(pattern.to(dtype))

    def _mask(self, n_queries: int, n_keys: int, offset: int, position_bias, additive, like) -> torch.Tensor:
        """Position bias + padding mask + causal mask, one float tensor broadcasting to the scores."""
        mask = torch.zeros(1, 1, n_queries, n_keys, dtype=like.dtype, device=like.device)
        if position_bias is not None:
            mask = mask + position_bias
        if additive is not None:
            mask = mask + additive.to(like.dtype)
        if self.causal:
            queries = torch.arange(offset, offset + n_queries, device=like.device)[:, None]
            future = torch.arange(n_keys, device=like.device)[None, :] > queries  # [q_pos, k_pos]
            mask = mask.masked_fill(future, float("-inf"))
        return mask


def repeat_heads(
    x: Float[torch.Tensor, "batch pos d_model"], n_heads: int
) -> Float[torch.Tensor, "batch pos head d_model"]:
    return x.unsqueeze(2).repeat(1, 1, n_heads, 1)  # [batch, pos, head, d_model]


class T5Block(nn.Module):
    """A T5 block (pre-RMSNorm): self-attention, cross-attention in the decoder, then the MLP.

    Hook names follow TransformerLens 2.18: `hook_resid_pre`, `hook_attn_out`, `hook_resid_mid`,
    in the decoder `hook_cross_attn_out` and `hook_resid_mid_cross`, then `hook_mlp_out`,
    `hook_resid_post`. The decoder's norms are `ln1` (self), `ln2` (cross), `ln3` (MLP).
    """

    def __init__(self, cfg: HookedTransformerConfig, block_index: int, is_decoder: bool):
        super().__init__()
        self.cfg, self.is_decoder = cfg, is_decoder
        self.ln1 = RMSNorm(cfg)
        self.attn = T5Attention(cfg, has_relative_attention_bias=block_index == 0, is_decoder=is_decoder)
        self.ln2 = RMSNorm(cfg)
        if is_decoder:
            self.cross_attn = T5Attention(cfg, is_decoder=True, is_cross_attention=True)
            self.ln3 = RMSNorm(cfg)
            self.hook_cross_attn_in = HookPoint(requires="use_attn_in")  # [batch, pos, d_model]
            self.hook_cross_attn_out = HookPoint()  # [batch, pos, d_model]
            self.hook_resid_mid_cross = HookPoint()  # [batch, pos, d_model]
        self.mlp = GatedMLP(cfg) if cfg.gated_mlp else MLP(cfg)
        self.hook_q_input = HookPoint(requires="use_split_qkv_input")  # [batch, pos, head, d_model]
        self.hook_k_input = HookPoint(requires="use_split_qkv_input")  # [batch, pos, head, d_model]
        self.hook_v_input = HookPoint(requires="use_split_qkv_input")  # [batch, pos, head, d_model]
        self.hook_attn_in = HookPoint(requires="use_attn_in")  # [batch, pos, head, d_model]
        self.hook_attn_out = HookPoint()  # [batch, pos, d_model]
        self.hook_mlp_in = HookPoint(requires="use_hook_mlp_in")  # [batch, pos, d_model]
        self.hook_mlp_out = HookPoint()  # [batch, pos, d_model]
        self.hook_resid_pre = HookPoint()  # [batch, pos, d_model]
        self.hook_resid_mid = HookPoint()  # [batch, pos, d_model]
        self.hook_resid_post = HookPoint()  # [batch, pos, d_model]

    def forward(
        self,
        resid_pre: Float[torch.Tensor, "batch pos d_model"],
        additive_attention_mask: Float[torch.Tensor, "batch 1 1 pos"] | None = None,
        encoder_additive_attention_mask: Float[torch.Tensor, "batch 1 1 encoder_pos"] | None = None,
        position_bias: Float[torch.Tensor, "1 head pos kv_pos"] | None = None,
        encoder_hidden_states: Float[torch.Tensor, "batch encoder_pos d_model"] | None = None,
        past_kv_cache_entry=None,
        cross_key_value: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> Float[torch.Tensor, "batch pos d_model"]:
        resid_pre = self.hook_resid_pre(resid_pre)  # [batch, pos, d_model]
        q_in, k_in, v_in = self._attn_inputs(resid_pre)
        if k_in is q_in:
            attn_out = self._self_attend(q_in, past_kv_cache_entry, additive_attention_mask, position_bias)
        else:  # split-input mode: each of q, k, v normalizes its own copy
            attn_out = self.attn(
                self.ln1(q_in),
                self.ln1(k_in),
                self.ln1(v_in),
                past_kv_cache_entry=past_kv_cache_entry,
                additive_attention_mask=additive_attention_mask,
                position_bias=position_bias,
            )
        resid = self.hook_resid_mid(resid_pre + self.hook_attn_out(attn_out))  # [batch, pos, d_model]
        if self.is_decoder:
            resid = self._cross_attend(resid, encoder_hidden_states, encoder_additive_attention_mask, cross_key_value)
        mlp_in = self.hook_mlp_in(resid.clone()) if self.cfg.use_hook_mlp_in else resid
        normalized = (self.ln3 if self.is_decoder else self.ln2)(mlp_in)
        mlp_out = self.hook_mlp_out(self.mlp(normalized))  # [batch, pos, d_model]
        return self.hook_resid_post(mlp_in + mlp_out)  # [batch, pos, d_model]

    def _attn_inputs(self, resid_pre: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The query/key/value inputs: the residual, or per-head copies in split-input modes."""
        H = self.cfg.n_heads
        if self.cfg.use_split_qkv_input:
            return (
                self.hook_q_input(repeat_heads(resid_pre, H)),
                self.hook_k_input(repeat_heads(resid_pre, H)),
                self.hook_v_input(repeat_heads(resid_pre, H)),
            )
        if self.cfg.use_attn_in:
            attn_in = self.hook_attn_in(repeat_heads(resid_pre, H))  # [batch, pos, head, d_model]
            return attn_in, attn_in, attn_in
        return resid_pre, resid_pre, resid_pre

    def _self_attend(self, attn_in, past_kv_cache_entry, additive_attention_mask, position_bias) -> torch.Tensor:
        normalized = self.ln1(attn_in)  # one norm for q, k and v
        return self.attn(
            normalized,
            normalized,
            normalized,
            past_kv_cache_entry=past_kv_cache_entry,
            additive_attention_mask=additive_attention_mask,
            position_bias=position_bias,
        )

    def _cross_attend(self, resid_mid, encoder_hidden_states, encoder_mask, cross_key_value) -> torch.Tensor:
        if encoder_hidden_states is None and cross_key_value is None:
            raise ValueError(
                "A T5 decoder block needs encoder_hidden_states (the encoder's output) for cross-attention"
            )
        cross_in = self.hook_cross_attn_in(resid_mid.clone()) if self.cfg.use_attn_in else resid_mid
        out = self.cross_attn(
            self.ln2(cross_in),
            encoder_hidden_states,
            encoder_hidden_states,
            additive_attention_mask=encoder_mask,
            key_value=cross_key_value,
        )
        return self.hook_resid_mid_cross(resid_mid + self.hook_cross_attn_out(out))  # [batch, pos, d_model]
