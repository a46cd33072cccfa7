"""BERT's pieces: summed embeddings, the post-LayerNorm encoder block, and the two pre-training heads.

A BERT block normalizes *after* each sublayer's residual add (post-LN), unlike the pre-LN
decoder blocks:

    resid_mid  = resid_pre + attn(resid_pre)
    resid_post = ln1(resid_mid) + mlp(ln1(resid_mid))
    out        = ln2(resid_post)

The hook names are TransformerLens's (`hook_resid_mid`, `hook_normalized_resid_post`, ...),
and attention is the decoder's `Attention`, run bidirectionally with a key padding mask.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from jaxtyping import Float, Int

from hooked.components.activations import get_activation
from hooked.components.attention import Attention
from hooked.components.embed import Embed, PosEmbed
from hooked.components.forward_state import ForwardState
from hooked.components.mlp import MLP, linear
from hooked.components.norms import LayerNorm
from hooked.core.config import HookedTransformerConfig
from hooked.core.hook_points import HookPoint
from hooked.core.validation import require_set


class TokenTypeEmbed(nn.Module):
    """Segment embedding `W_token_type [2, d_model]`: row 0 for sentence A, row 1 for sentence B."""

    def __init__(self, cfg: HookedTransformerConfig | dict, n_types: int = 2):
        super().__init__()
        cfg = HookedTransformerConfig.unwrap(cfg)
        self.W_token_type = nn.Parameter(torch.empty(n_types, cfg.d_model, dtype=cfg.dtype))

    def forward(self, token_type_ids: Int[torch.Tensor, "batch pos"]) -> Float[torch.Tensor, "batch pos d_model"]:
        return F.embedding(token_type_ids, self.W_token_type)  # [batch, pos, d_model]


class BertEmbed(nn.Module):
    """`ln(token + position + token type)`: BERT's embedding, normalized before the first block."""

    def __init__(self, cfg: HookedTransformerConfig | dict):
        super().__init__()
        self.cfg = cfg = HookedTransformerConfig.unwrap(cfg)
        self.embed = Embed(cfg)
        self.pos_embed = PosEmbed(cfg)
        self.token_type_embed = TokenTypeEmbed(cfg)
        self.ln = LayerNorm(cfg)
        self.hook_embed = HookPoint()  # [batch, pos, d_model]
        self.hook_pos_embed = HookPoint()  # [batch, pos, d_model]
        self.hook_token_type_embed = HookPoint()  # [batch, pos, d_model]

    def forward(
        self,
        input_ids: Int[torch.Tensor, "batch pos"],
        token_type_ids: Int[torch.Tensor, "batch pos"] | None = None,
    ) -> Float[torch.Tensor, "batch pos d_model"]:
        """Positions count from 0 at every row, padding included, as HF's BertEmbeddings."""
        batch, n_pos = input_ids.shape
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        positions = torch.arange(n_pos, device=input_ids.device).expand(batch, n_pos)  # [batch, pos]
        embed = self.hook_embed(self.embed(input_ids))  # [batch, pos, d_model]
        pos_embed = self.hook_pos_embed(self.pos_embed.at_positions(positions))  # [batch, pos, d_model]
        type_embed = self.hook_token_type_embed(self.token_type_embed(token_type_ids))  # [batch, pos, d_model]
        return self.ln(embed + pos_embed + type_embed)


def encoder_state(
    resid: Float[torch.Tensor, "batch pos d_model"],
    one_zero_attention_mask: Int[torch.Tensor, "batch pos"] | None,
    causal: bool = False,
) -> ForwardState:
    """The `ForwardState` of an encoder call: every query sees every real (mask 1) key."""
    return ForwardState.for_input(resid.shape[0], resid.shape[1], resid.device, one_zero_attention_mask, causal)


def mask_from_additive(additive_attention_mask: Float[torch.Tensor, "batch 1 1 pos"]) -> Int[torch.Tensor, "batch pos"]:
    """TransformerLens's additive mask (0 attend, -inf ignore) as a one-zero key mask."""
    return (additive_attention_mask[:, 0, 0, :] == 0).long()  # [batch, pos]


class BertBlock(nn.Module):
    """Post-LN encoder block (see the module docstring for where `ln1`/`ln2` sit)."""

    def __init__(self, cfg: HookedTransformerConfig | dict, layer: int = 0):
        super().__init__()
        self.cfg = cfg = HookedTransformerConfig.unwrap(cfg)
        self.layer = layer
        self.attn = Attention(cfg, layer)
        self.ln1 = LayerNorm(cfg)
        self.mlp = MLP(cfg)
        self.ln2 = LayerNorm(cfg)
        self.hook_q_input = HookPoint(requires="use_split_qkv_input")  # [batch, pos, head, d_model]
        self.hook_k_input = HookPoint(requires="use_split_qkv_input")  # [batch, pos, head, d_model]
        self.hook_v_input = HookPoint(requires="use_split_qkv_input")  # [batch, pos, head, d_model]
        self.hook_attn_out = HookPoint()  # [batch, pos, d_model]
        self.hook_mlp_in = HookPoint(requires="use_hook_mlp_in")  # [batch, pos, d_model]
        self.hook_mlp_out = HookPoint()  # [batch, pos, d_model]
        self.hook_resid_pre = HookPoint()  # [batch, pos, d_model]
        self.hook_resid_mid = HookPoint()  # [batch, pos, d_model]
        self.hook_resid_post = HookPoint()  # [batch, pos, d_model]
        self.hook_normalized_resid_post = HookPoint()  # [batch, pos, d_model]

    def forward(
        self,
        resid_pre: Float[torch.Tensor, "batch pos d_model"],
        additive_attention_mask: Float[torch.Tensor, "batch 1 1 pos"] | None = None,
        *,
        state: ForwardState | None = None,
    ) -> Float[torch.Tensor, "batch pos d_model"]:
        """One block; called alone it takes TransformerLens's additive mask, the model passes its `state`."""
        if state is None:
            mask = None if additive_attention_mask is None else mask_from_additive(additive_attention_mask)
            state = encoder_state(resid_pre, mask, self.cfg.attention_dir == "causal")
        resid_pre = self.hook_resid_pre(resid_pre)
        q_in = k_in = v_in = resid_pre
        if self.cfg.use_split_qkv_input:
            n = self.cfg.n_heads
            q_in = self.hook_q_input(_per_head(resid_pre, n))  # [batch, pos, head, d_model]
            k_in = self.hook_k_input(_per_head(resid_pre, n))  # [batch, pos, head, d_model]
            v_in = self.hook_v_input(_per_head(resid_pre, n))  # [batch, pos, head, d_model]
        attn_out = self.hook_attn_out(self.attn(q_in, k_in, v_in, state))
        resid_mid = self.hook_resid_mid(resid_pre + attn_out)
        mlp_in = self.hook_mlp_in(resid_mid.clone()) if self.cfg.use_hook_mlp_in else resid_mid
        normalized_resid_mid = self.ln1(mlp_in)
        mlp_out = self.hook_mlp_out(self.mlp(normalized_resid_mid))
        resid_post = self.hook_resid_post(normalized_resid_mid + mlp_out)
        return self.hook_normalized_resid_post(self.ln2(resid_post))


def _per_head(x: Float[torch.Tensor, "batch pos d_model"], n: int) -> Float[torch.Tensor, "batch pos head d_model"]:
    return x.unsqueeze(2).repeat(1, 1, n, 1)


class BertMLMHead(nn.Module):
    """The masked-LM transform before the unembedding: `ln(act(x W + b))`, `act` being the MLP's (GELU for BERT)."""

    def __init__(self, cfg: HookedTransformerConfig | dict):
        super().__init__()
        cfg = HookedTransformerConfig.unwrap(cfg)
        self.W = nn.Parameter(torch.empty(cfg.d_model, cfg.d_model, dtype=cfg.dtype))
        self.b = nn.Parameter(torch.zeros(cfg.d_model, dtype=cfg.dtype))
        self.act_fn = get_activation(require_set(cfg.act_fn, "act_fn"))
        self.ln = LayerNorm(cfg)

    def forward(self, resid: Float[torch.Tensor, "batch pos d_model"]) -> Float[torch.Tensor, "batch pos d_model"]:
        return self.ln(self.act_fn(linear(resid, self.W, self.b)))


class BertPooler(nn.Module):
    """`tanh(x[:, 0] W + b)`: the first ([CLS]) position as one vector per sequence."""

    def __init__(self, cfg: HookedTransformerConfig | dict):
        super().__init__()
        cfg = HookedTransformerConfig.unwrap(cfg)
        self.W = nn.Parameter(torch.empty(cfg.d_model, cfg.d_model, dtype=cfg.dtype))
        self.b = nn.Parameter(torch.zeros(cfg.d_model, dtype=cfg.dtype))
        self.activation = nn.Tanh()
        self.hook_pooler_out = HookPoint(pos_axis=None)  # [batch, d_model]

    def forward(self, resid: Float[torch.Tensor, "batch pos d_model"]) -> Float[torch.Tensor, "batch d_model"]:
        return self.hook_pooler_out(self.activation(linear(resid[:, 0], self.W, self.b)))


class BertNSPHead(nn.Module):
    """Next-sentence logits `x W + b`, `[batch, 2]`: index 0 "B follows A", index 1 "B is random"."""

    def __init__(self, cfg: HookedTransformerConfig | dict):
        super().__init__()
        cfg = HookedTransformerConfig.unwrap(cfg)
        self.W = nn.Parameter(torch.empty(cfg.d_model, 2, dtype=cfg.dtype))
        self.b = nn.Parameter(torch.zeros(2, dtype=cfg.dtype))
        self.hook_nsp_out = HookPoint(pos_axis=None)  # [batch, 2]

    def forward(self, resid: Float[torch.Tensor, "batch d_model"]) -> Float[torch.Tensor, "batch 2"]:
        return self.hook_nsp_out(linear(resid, self.W, self.b))
