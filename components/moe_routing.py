"""Routers beyond a softmax over every expert: DeepSeek's and GLM's, LFM2-MoE's, GraniteMoE's, PhiMoE's sparsemixer.

Each is a `components.moe.SharedExpertMoE` (a `MoE`, plus an always-on shared expert where the config
has one) whose `route` differs; the experts, their dispatch and their hooks are `MoE`'s. Hooks under
`blocks.{l}.mlp.` (E experts, k per token, G groups):

| router (`cfg.router_scoring`) | `hook_router_logits` `[b,p,E]` | `hook_expert_weights` `[b,p,E]` | choice |
|---|---|---|---|
| `softmax`, float32 router (DeepSeek-V2) | `x W^T` in float32 | softmax of the logits | top-k of the scores in the best groups (`hook_expert_groups` `[b,p,topk_groups]`) |
| `sigmoid` (DeepSeek-V3, GLM, LFM2-MoE) | `x W^T` in float32 (`router_in_fp32`) or the model dtype (LFM2-MoE) | sigmoid of the logits (float32) | top-k of scores + `e_score_correction_bias`, in the best groups |
| `topk_softmax` (GraniteMoE, Granite-hybrid) | `x W^T`, cast to float32 | softmax of the logits | top-k of the logits |
| `sparsemixer` (PhiMoE) | `x W^T`, model dtype | each expert's final weight (0 if not chosen) | two masked softmaxes |

Sigmoid routing always has the selection bias `e_score_correction_bias` `[E]` (float32, a buffer:
DeepSeek-V3's and GLM's correction bias, LFM2-MoE's `expert_bias`; zeros for a checkpoint without
one). It only chooses: the weights are the sigmoid scores. Grouped routing (DeepSeek's `n_group`,
`topk_group`): the experts form G equal groups; a group scores its best expert (softmax) or the sum
of its two best (sigmoid, with the bias); each token chooses its experts within its
`router_topk_groups` best groups. The routing weights are the chosen experts' scores, renormalized
(`norm_topk_prob`: divided by their sum plus `cfg.router_norm_eps`, HF's 1e-20 or LFM2-MoE's 1e-6),
then multiplied by `cfg.routed_scaling_factor`. Editing `hook_expert_weights` changes the choice and
the weights; `hook_expert_groups` forces groups; `hook_expert_indices` forces experts (weighted by
their scores).
"""  # noqa: E501 - a markdown table keeps each row on one line

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from jaxtyping import Float, Int

from hooked.components import moe
from hooked.components.moe import MoE, SharedExpertMoE
from hooked.components.norms import unedited
from hooked.core.config import HookedTransformerConfig
from hooked.core.dtypes import HALF_DTYPES
from hooked.core.hook_points import HookPoint
from hooked.core.validation import require_set

Route = tuple[Int[torch.Tensor, "batch pos k"], Float[torch.Tensor, "batch pos k"]]


class Float32Router(nn.Linear):
    """A bias-free router weight kept in float32 in every model dtype (HF's `_keep_in_fp32_modules_strict`)."""

    def cast_parameter(self, leaf: str, tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return tensor.float()

    def _apply(self, fn, recurse: bool = True):
        weight = self.weight.data  # before `fn` (e.g. `.to(torch.bfloat16)`) rounds it
        super()._apply(fn, recurse)
        if self.weight.dtype in HALF_DTYPES:
            self.weight.data = weight.to(self.weight.device, torch.float32)
        return self


class GroupLimitedMoE(SharedExpertMoE):
    """DeepSeek-V2/V3, GLM-4-MoE, GLM-MoE-DSA, LFM2-MoE: softmax or sigmoid scores, a selection bias (sigmoid),
    optional groups (None: one group of every expert), scaled weights, and a shared expert if the config has one
    (module docstring). The router is float32 with `cfg.router_in_fp32` (DeepSeek, GLM), else in the model dtype
    (LFM2-MoE)."""

    def __init__(self, cfg: HookedTransformerConfig):
        super().__init__(cfg)
        if cfg.router_in_fp32:
            self.W_gate = Float32Router(cfg.d_model, self.num_experts, bias=False, dtype=torch.float32)
        if cfg.router_scoring == "sigmoid":  # a buffer, as HF's: set by a balancing rule, not by gradients
            self.register_buffer("e_score_correction_bias", torch.zeros(self.num_experts, dtype=torch.float32))
        if cfg.router_groups is not None:
            self.hook_expert_groups = HookPoint()  # [batch, pos, router_topk_groups]: the chosen groups

    def cast_parameter(self, leaf: str, tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return tensor.float() if leaf == "e_score_correction_bias" else tensor.to(dtype)

    def _apply(self, fn, recurse: bool = True):
        bias = getattr(self, "e_score_correction_bias", None)
        super()._apply(fn, recurse)
        if bias is not None and self.e_score_correction_bias.dtype != torch.float32:
            self.e_score_correction_bias = bias.to(self.e_score_correction_bias.device, torch.float32)
        return self

    def route(self, x: Float[torch.Tensor, "batch pos d_model"]) -> Route:
        """Scores, groups, top-k and weights on `[tokens, E]`, op for op as HF's `TopkRouter` (LFM2-MoE's router)."""
        lead, E, cfg = x.shape[:-1], self.num_experts, self.cfg
        if cfg.router_in_fp32:
            logits = F.linear(x.float(), self.W_gate.weight.float())  # [batch, pos, E], float32
        else:
            logits = F.linear(x, self.W_gate.weight)  # [batch, pos, E], model dtype
        logits = self.hook_router_logits(logits)
        sigmoid = cfg.router_scoring == "sigmoid"
        scores = logits.float().sigmoid() if sigmoid else logits.softmax(-1, dtype=torch.float32)
        flat = self.hook_expert_weights(scores).reshape(-1, E)  # [tokens, E], float32
        # HF adds the bias to the scores in the router's dtype (LFM2-MoE: the model's; a no-op cast in float32)
        choice = flat.to(logits.dtype) + self.e_score_correction_bias if sigmoid else flat
        if cfg.router_groups is not None:
            choice = self._within_groups(choice, lead, fill=float("-inf") if sigmoid else 0.0)
        # HF's float32 routers (DeepSeek, GLM) take their top-k unsorted, LFM2-MoE's sorted
        indices = torch.topk(choice, self.top_k, dim=-1, sorted=not cfg.router_in_fp32)[1]  # [tokens, k]
        indices = self.hook_expert_indices(indices.view(*lead, self.top_k))  # [batch, pos, k]
        weights = (choice if not sigmoid else flat).gather(1, indices.reshape(-1, self.top_k))  # [tokens, k]
        weights = weights.to(logits.dtype)  # LFM2-MoE weighs in the model dtype; float32 routers stay float32
        if cfg.norm_topk_prob:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + cfg.router_norm_eps)
        return indices, (weights * cfg.routed_scaling_factor).view(*lead, self.top_k)

    def _within_groups(self, choice: Float[torch.Tensor, "tokens E"], lead, fill: float) -> torch.Tensor:
        """`choice` with the experts outside each token's best `router_topk_groups` groups set to `fill`."""
        G, E = require_set(self.cfg.router_groups, "router_groups"), self.num_experts
        grouped = choice.view(-1, G, E // G)  # [tokens, G, E / G]
        if self.cfg.router_scoring == "sigmoid":
            group_scores = grouped.topk(2, dim=-1)[0].sum(dim=-1)  # [tokens, G]: each group's two best
        else:
            group_scores = grouped.max(dim=-1).values  # [tokens, G]: each group's best
        k_groups = require_set(self.cfg.router_topk_groups, "router_topk_groups")
        groups = torch.topk(group_scores, k=k_groups, dim=-1, sorted=False)[1]  # [tokens, topk_groups]
        groups = self.hook_expert_groups(groups.view(*lead, k_groups)).reshape(-1, k_groups)
        group_mask = torch.zeros_like(group_scores).scatter_(1, groups, 1)  # [tokens, G]
        expert_mask = group_mask.unsqueeze(-1).expand(-1, G, E // G).reshape(-1, E)  # [tokens, E]
        return choice.masked_fill(~expert_mask.bool(), fill)


class TopKSoftmaxMoE(SharedExpertMoE):
    """GraniteMoE, Granite-hybrid: top-k of the logits (cast to float32), weights a softmax over those k logits
    (Granite-hybrid adds an ungated shared expert, `SharedExpertMoE`).

    `hook_expert_weights` is the softmax over all experts; while no hook edits it, the choice
    and weights are HF's (a top-k of the logits); an edit picks and weighs from the edited
    probabilities, renormalized, as `MoE` does.
    """

    def route(self, x: Float[torch.Tensor, "batch pos d_model"]) -> Route:
        logits = self.hook_router_logits(F.linear(x, self.W_gate.weight).float())  # [batch, pos, E]
        computed = torch.softmax(logits, dim=-1)  # [batch, pos, E]
        before = computed.clone() if self.hook_expert_weights.observed else None
        probs = self.hook_expert_weights(computed)
        kept = before is None or unedited(computed, before, probs)
        indices = logits.topk(self.top_k, dim=-1)[1] if kept else probs.topk(self.top_k, dim=-1)[1]
        indices = self.hook_expert_indices(indices)  # [batch, pos, k]
        if kept:  # HF's softmax over the chosen logits
            return indices, torch.softmax(logits.gather(-1, indices), dim=-1)
        weights = probs.gather(-1, indices)
        return indices, weights / weights.sum(-1, keepdim=True)


class SparseMixerMoE(SharedExpertMoE):
    """PhiMoE's sparsemixer (inference): two experts, each picked as the best remaining logit.

    Selection s (s = 1, 2) takes the best logit `m_s` among the experts not yet chosen and
    weighs it by a softmax over the experts whose logit is within `2 * eps` of `m_s`
    (relative: `(m_s - l) / max(|l|, m_s) <= 2 eps`). `hook_expert_weights` is each expert's
    final weight `[b,p,E]` (0 unless chosen): editing it reweighs; forcing experts through
    `hook_expert_indices` weighs them by it.
    """

    def route(self, x: Float[torch.Tensor, "batch pos d_model"]) -> Route:
        logits = self.hook_router_logits(F.linear(x, self.W_gate.weight))  # [batch, pos, E], model dtype
        flat = logits.reshape(-1, logits.shape[-1])  # [tokens, E]
        multipliers, selected = sparsemixer(flat, self.cfg.sparsemixer_jitter_eps)  # [tokens, 2] each
        dense = torch.zeros_like(flat).scatter(1, selected, multipliers)  # [tokens, E]
        weights = self.hook_expert_weights(dense.view(logits.shape))  # [batch, pos, E]
        indices = self.hook_expert_indices(selected.view(*logits.shape[:-1], 2))  # [batch, pos, 2]
        return indices, weights.gather(-1, indices)


def sparsemixer(
    scores: Float[torch.Tensor, "tokens E"], jitter_eps: float
) -> tuple[Float[torch.Tensor, "tokens 2"], Int[torch.Tensor, "tokens 2"]]:
    """`(multipliers, selected)` of HF's `sparsemixer` at inference (no sampling), op for op."""
    multipliers, selected = [], []
    masked_scores = scores
    for _ in range(2):
        threshold, best = masked_scores.max(dim=-1, keepdim=True)  # [tokens, 1]
        factor = scores.abs().clamp(min=threshold)
        too_far = ((threshold - scores) / factor) > (2 * jitter_eps)  # [tokens, E]
        gates = torch.softmax(masked_scores.masked_fill(too_far, float("-inf")), dim=-1)
        multipliers.append(gates.gather(dim=-1, index=best))
        selected.append(best)
        masked_scores = torch.scatter(scores, -1, best, float("-inf"))  # the first choice leaves the second's pool
    return torch.cat(multipliers, dim=-1), torch.cat(selected, dim=-1)


def make_moe(cfg: HookedTransformerConfig) -> MoE:
    """The mixture of experts of `cfg`, whatever its router (`components.moe.make_moe`: softmax routers)."""
    if cfg.router_scoring == "topk_softmax":
        return TopKSoftmaxMoE(cfg)
    if cfg.router_scoring == "sparsemixer":
        return SparseMixerMoE(cfg)
    scaled = cfg.routed_scaling_factor != 1.0
    if cfg.router_scoring == "sigmoid" or cfg.router_groups is not None or cfg.router_in_fp32 or scaled:
        return GroupLimitedMoE(cfg)
    return moe.make_moe(cfg)
