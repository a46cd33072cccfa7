"""One transformer block: attention and MLP sublayers reading from and writing to the residual stream."""

from __future__ import annotations

import torch
import torch.nn as nn
from jaxtyping import Float, Int

from hooked.components.attention import Attention, GroupedQueryAttention
from hooked.components.dsa import SparseLatentAttention
from hooked.components.forward_state import ForwardState
from hooked.components.gated_attention import gated_attention_class
from hooked.components.kv_sharing import SharedKVAttention
from hooked.components.mla import MultiHeadLatentAttention
from hooked.components.mlp import MLP, GatedMLP
from hooked.components.moe_routing import make_moe
from hooked.components.norms import make_norm
from hooked.core.config import HookedTransformerConfig
from hooked.core.hook_points import HookPoint

#: the norm kind a post-sublayer norm keeps after fold_ln (it is never folded)
_POST_NORM = {"LNPre": "LN", "RMSPre": "RMS"}


class TransformerBlock(nn.Module):
    """Pre-norm block, sequential (`resid_mid` between sublayers), parallel, or attention-only.

    `ln1` runs once per block. In split-input mode (`use_split_qkv_input`) the per-head
    copies of the residual for q, k and v are concatenated on the head axis and
    normalized in that one call.
    """

    def __init__(self, cfg: HookedTransformerConfig, layer: int):
        super().__init__()
        cfg = cfg.layer_config(layer)  # the model's config, or a view with this layer's shapes (Gemma 3n/4)
        self.cfg, self.layer = cfg, layer
        self._init_attention(cfg, layer)
        if not cfg.attn_only:
            self._init_mlp(cfg, resid_mid=not cfg.parallel_attn_mlp)
        self.hook_resid_post = HookPoint()  # [batch, pos, d_model]

    def _init_attention(self, cfg: HookedTransformerConfig, layer: int) -> None:
        """`ln1`, the attention and its block-level hooks (`hook_resid_pre` ... `hook_attn_out`)."""
        self.ln1 = make_norm(cfg)
        self.attn = attention_class(cfg, layer)(cfg, layer)
        if cfg.use_normalization_before_and_after:  # post-sublayer norms keep their gain after fold_ln
            self.ln1_post = make_norm(cfg, _POST_NORM.get(cfg.normalization_type or ""))
        self.hook_resid_pre = HookPoint()  # [batch, pos, d_model]
        self.hook_attn_in = HookPoint(requires="use_attn_in")  # [batch, pos, head, d_model]
        self.hook_q_input = HookPoint(requires="use_split_qkv_input")  # [batch, pos, head, d_model]
        self.hook_k_input = HookPoint(requires="use_split_qkv_input")  # [batch, pos, kv_head, d_model]
        self.hook_v_input = HookPoint(requires="use_split_qkv_input")  # [batch, pos, kv_head, d_model]
        self.hook_attn_out = HookPoint()  # [batch, pos, d_model]

    def _init_mlp(self, cfg: HookedTransformerConfig, resid_mid: bool) -> None:
        """`ln2`, the MLP (dense, gated or mixture of experts) and its hooks; `hook_resid_mid` before it."""
        self.ln2 = make_norm(cfg)
        if cfg.is_moe_layer(self.layer):
            self.mlp = make_moe(cfg)
        else:  # DeepSeek's, LFM2-MoE's first layers too: dense, as wide as the layer's config says (`layer_d_mlp`)
            self.mlp = GatedMLP(cfg) if cfg.gated_mlp else MLP(cfg)
        if cfg.use_normalization_before_and_after:
            self.ln2_post = make_norm(cfg, _POST_NORM.get(cfg.normalization_type or ""))
        self.hook_mlp_in = HookPoint(requires="use_hook_mlp_in")  # [batch, pos, d_model]
        self.hook_mlp_out = HookPoint()  # [batch, pos, d_model]
        if resid_mid:
            self.hook_resid_mid = HookPoint()  # [batch, pos, d_model]

    def forward(
        self,
        resid_pre: Float[torch.Tensor, "batch pos d_model"],
        state: ForwardState | None = None,
        shortformer_pos_embed: Float[torch.Tensor, "batch pos d_model"] | None = None,
        *,
        attention_mask: Int[torch.Tensor, "batch pos"] | None = None,
    ) -> Float[torch.Tensor, "batch pos d_model"]:
        """One block; `state` is the model's (called alone, TransformerLens-style, it is built from the input)."""
        if state is None or isinstance(state, torch.Tensor):  # TL's block(resid_pre, shortformer_pos_embed)
            shortformer_pos_embed = state if state is not None else shortformer_pos_embed
            causal = self.cfg.attention_dir == "causal"
            state = ForwardState.for_input(
                resid_pre.shape[0], resid_pre.shape[1], resid_pre.device, attention_mask, causal
            )
        resid_pre = self.hook_resid_pre(resid_pre)
        attn_out = self.hook_attn_out(self._attention(resid_pre, state, shortformer_pos_embed))
        if self.cfg.attn_only:
            return self.hook_resid_post(resid_pre + attn_out)
        if self.cfg.parallel_attn_mlp:
            if self.cfg.parallel_residual_last:  # HF's GPT-NeoX, Phi, GPT-J, Falcon: bit for bit in half precision
                return self.hook_resid_post(attn_out + self._mlp(resid_pre) + resid_pre)
            return self.hook_resid_post(resid_pre + attn_out + self._mlp(resid_pre))
        resid_mid = self.hook_resid_mid(resid_pre + attn_out)
        return self.hook_resid_post(self._finish(resid_mid + self._mlp(resid_mid), state))

    def _attention(self, resid, state, shortformer_pos_embed) -> Float[torch.Tensor, "batch pos d_model"]:
        cfg = self.cfg
        if cfg.use_split_qkv_input:
            kv_heads = cfg.n_heads if cfg.ungroup_grouped_query_attention else cfg.n_kv_heads
            streams = [
                self.hook_q_input(_per_head(resid, cfg.n_heads)),  # [batch, pos, head, d_model]
                self.hook_k_input(_per_head(resid, kv_heads)),  # [batch, pos, kv_head, d_model]
                self.hook_v_input(_per_head(resid, kv_heads)),  # [batch, pos, kv_head, d_model]
            ]
            normed = self._norm_attn_in(torch.cat(streams, dim=2))  # [batch, pos, head + 2 kv_head, d_model]
            q_in, k_in, v_in = normed.split([cfg.n_heads, kv_heads, kv_heads], dim=2)
        elif cfg.use_attn_in:
            q_in = k_in = v_in = self._norm_attn_in(self.hook_attn_in(_per_head(resid, cfg.n_heads)))
        else:
            q_in = k_in = v_in = self._norm_attn_in(resid)
        if shortformer_pos_embed is not None:
            pos = shortformer_pos_embed if q_in.ndim == 3 else shortformer_pos_embed[:, :, None]
            q_in, k_in = q_in + pos, k_in + pos
        return self._norm_attn_out(self.attn(q_in, k_in, v_in, state))

    def _mlp(self, mlp_in: Float[torch.Tensor, "batch pos d_model"]) -> Float[torch.Tensor, "batch pos d_model"]:
        if self.cfg.use_hook_mlp_in:
            mlp_in = self.hook_mlp_in(mlp_in.clone())
        return self.hook_mlp_out(self._norm_mlp_out(self.mlp(self._norm_mlp_in(mlp_in))))

    def _finish(self, resid: Float[torch.Tensor, "batch pos d_model"], state: ForwardState) -> torch.Tensor:
        """What a sequential block does to its stream after the MLP: nothing here (Gemma 4: `Gemma4Block`)."""
        return resid

    # Where the norms sit; `PostNormBlock` (OLMo-2/3) moves ln1/ln2 to the sublayer outputs.
    def _norm_attn_in(self, x: torch.Tensor) -> torch.Tensor:
        return self.ln1(x)

    def _norm_attn_out(self, out: Float[torch.Tensor, "batch pos d_model"]) -> torch.Tensor:
        return self.ln1_post(out) if self.cfg.use_normalization_before_and_after else out

    def _norm_mlp_in(self, x: Float[torch.Tensor, "batch pos d_model"]) -> torch.Tensor:
        return self.ln2(x)

    def _norm_mlp_out(self, out: Float[torch.Tensor, "batch pos d_model"]) -> torch.Tensor:
        return self.ln2_post(out) if self.cfg.use_normalization_before_and_after else out


def attention_class(cfg: HookedTransformerConfig, layer: int) -> type[Attention]:
    """The attention of block `layer` (`cfg` its `layer_config`): queries only, attending to an earlier layer's keys
    and values (KV sharing, Gemma 3n/4); sparse latent (DSA); latent (MLA); output-gated (Qwen3-Next);
    grouped-query; or multi-head."""
    if cfg.kv_source(layer) is not None:
        return SharedKVAttention
    if cfg.uses_sparse_attention:
        return SparseLatentAttention
    if cfg.uses_mla:
        return MultiHeadLatentAttention
    if cfg.attn_output_gate:
        return gated_attention_class(cfg)
    return GroupedQueryAttention if cfg.uses_grouped_query_attention else Attention


def _per_head(x: Float[torch.Tensor, "batch pos d_model"], n: int) -> Float[torch.Tensor, "batch pos head d_model"]:
    """n independent copies of the residual, one per head, so hooks can edit each head's input."""
    return x.unsqueeze(2).repeat(1, 1, n, 1)
