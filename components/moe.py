"""Mixture of experts: a router picks `experts_per_token` gated MLPs per token and mixes their outputs.

    probs   = softmax(x W_gate^T)                (float32, over all experts)  -> hook_expert_weights
    indices = top-k(probs)                                                     -> hook_expert_indices
    weights = probs[indices], renormalized to sum 1 if `norm_topk_prob` (Mixtral, Qwen3-MoE, OLMoE;
              GPT-OSS's softmax over the top-k logits is this renormalization); cast to the
              model dtype before weighing the experts' outputs, except with `moe_mix_in_fp32`
              (Mixtral: the product is float32, cast after, as HF)
    out     = sum_k weights_k * expert_{indices_k}(x)
              + sigmoid(x w_s) * shared_expert(x)  (Qwen2-MoE, Qwen3-Next; without `shared_expert_gate`
                                                    the shared expert is added as is: DeepSeek, GLM, Granite-hybrid)

Routers other than this softmax (sigmoid scores with a selection bias, groups, GraniteMoE's and
PhiMoE's) are subclasses in `components/moe_routing.py`; every one keeps these experts and hooks.

Experts are dispatched by grouping: the (token, slot) pairs are sorted by expert, each
expert runs once on the contiguous block of tokens routed to it (one matmul per weight,
possibly on zero rows), and one `index_add_` scatters the weighted outputs back. Below
float32 they go back to (token, slot) order instead and are summed over the slots, then
cast once (HF's default `grouped_mm` experts, bit for bit in bfloat16 and float16). The
only Python loop is over experts, never over tokens. Every expert's hooks fire on every
forward it is hooked on, with shape `[n_e, d_mlp]` for the `n_e` tokens routed to it (an expert that
no token reached and no hook watches is skipped: it adds nothing).

Weights use TransformerLens's MoE layout (bias-free `nn.Linear`, `[out, in]`): the
router `W_gate.weight [E, d_model]` and `experts.{e}.W_in/W_gate/W_out.weight`.
Editing `hook_expert_weights` changes both the choice and the weights of the experts;
editing `hook_expert_indices` forces experts (their weights are read from the probs).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import torch
import torch.nn as nn
import torch.nn.functional as F
from jaxtyping import Float, Int

from hooked.components.activations import get_activation
from hooked.components.norms import unedited
from hooked.core.config import HookedTransformerConfig
from hooked.core.hook_points import HookPoint
from hooked.core.validation import require_set


class Expert(nn.Module):
    """One gated expert: `W_out(act(W_gate x) * W_in x)`, with bias-free `nn.Linear` weights (TL's `MoEGatedMLP`)."""

    def __init__(self, cfg: HookedTransformerConfig, d_mlp: int, pos_axis: int | None = None, bias: bool = False):
        super().__init__()
        d, dt = cfg.d_model, cfg.dtype
        self.W_in = nn.Linear(d, d_mlp, bias=bias, dtype=dt)
        self.W_gate = nn.Linear(d, d_mlp, bias=bias, dtype=dt)
        self.W_out = nn.Linear(d_mlp, d, bias=bias, dtype=dt)
        self.act_fn = get_activation(require_set(cfg.act_fn, "act_fn"))
        self.hook_gate = HookPoint(pos_axis)  # [n_tokens, d_mlp] (shared expert: [batch, pos, d_mlp])
        self.hook_pre = HookPoint(pos_axis)  # [n_tokens, d_mlp]
        self.hook_post = HookPoint(pos_axis)  # [n_tokens, d_mlp]
        self.hook_out = HookPoint(pos_axis)  # [n_tokens, d_model]: the expert's output, before its routing weight

    def forward(self, x: Float[torch.Tensor, "... d_model"]) -> Float[torch.Tensor, "... d_model"]:
        gate = self.hook_gate(F.linear(x, self.W_gate.weight))  # [..., d_mlp]
        pre = self.hook_pre(F.linear(x, self.W_in.weight))  # [..., d_mlp]
        post = self.hook_post(self.act_fn(gate) * pre)  # [..., d_mlp]
        return self.hook_out(F.linear(post, self.W_out.weight))


class ClampedSwiGLUExpert(Expert):
    """GPT-OSS's expert: biases, and `(clamp(up) + 1) * g * sigmoid(alpha * g)` with `g = clamp(gate, max=limit)`.

    `hook_gate`/`hook_pre` are the projections before the clamps, `hook_post` the product.
    """

    def __init__(self, cfg: HookedTransformerConfig, d_mlp: int, pos_axis: int | None = None):
        super().__init__(cfg, d_mlp, pos_axis, bias=True)
        self.limit, self.alpha = require_set(cfg.swiglu_limit, "swiglu_limit"), cfg.swiglu_alpha

    def forward(self, x: Float[torch.Tensor, "... d_model"]) -> Float[torch.Tensor, "... d_model"]:
        # HF's grouped experts add each bias after the product (two roundings below float32)
        gate = self.hook_gate(F.linear(x, self.W_gate.weight) + self.W_gate.bias).clamp(max=self.limit)  # [..., d_mlp]
        up = self.hook_pre(F.linear(x, self.W_in.weight) + self.W_in.bias).clamp(-self.limit, self.limit)
        post = self.hook_post((up + 1) * (gate * torch.sigmoid(gate * self.alpha)))  # [..., d_mlp]
        return self.hook_out(F.linear(post, self.W_out.weight) + self.W_out.bias)


class MoE(nn.Module):
    """Router plus `num_experts` experts, `experts_per_token` of them active per token."""

    router_bias = False
    expert_cls = Expert

    def __init__(self, cfg: HookedTransformerConfig | dict):
        super().__init__()
        self.cfg = cfg = HookedTransformerConfig.unwrap(cfg)
        self.num_experts = require_set(cfg.num_experts, "num_experts")
        self.top_k = require_set(cfg.experts_per_token, "experts_per_token")
        self.W_gate = nn.Linear(cfg.d_model, self.num_experts, bias=self.router_bias, dtype=cfg.dtype)  # the router
        d_mlp = require_set(cfg.d_mlp, "d_mlp")
        self.experts = nn.ModuleList(self.expert_cls(cfg, d_mlp) for _ in range(self.num_experts))
        self.hook_router_logits = HookPoint()  # [batch, pos, num_experts], model dtype
        self.hook_expert_weights = HookPoint()  # [batch, pos, num_experts], float32
        self.hook_expert_indices = HookPoint()  # [batch, pos, experts_per_token]

    def _watched_experts(self) -> set[int]:
        """The experts a hook watches (they run even with no token), in one pass over their hook points.

        The hook points are listed once (and again if an expert was replaced): a decode step asks this
        of every MoE layer, and attribute lookups through `nn.Module` cost more than the checks.
        """
        listed = self.__dict__.get("_expert_hooks")
        if listed is None or any(a is not b for a, b in zip(listed[0], self.experts, strict=True)):
            hooks = [
                (e, m) for e, expert in enumerate(self.experts) for m in expert.modules() if isinstance(m, HookPoint)
            ]
            listed = self.__dict__["_expert_hooks"] = (list(self.experts), hooks)
        # `HookPoint.observed`, spelled out: any hook function or module hook, or an external tracer on it
        return {
            e
            for e, hp in listed[1]
            if hp._fwd_fns or hp._bwd_fns or hp._forward_hooks or hp._forward_pre_hooks or hp.traced_externally
        }

    def route(
        self, x: Float[torch.Tensor, "batch pos d_model"]
    ) -> tuple[Int[torch.Tensor, "batch pos k"], Float[torch.Tensor, "batch pos k"]]:
        """`(indices, weights)` of the experts each token goes to: softmax over all, top-k, renormalize."""
        logits = self.hook_router_logits(F.linear(x, self.W_gate.weight, self.W_gate.bias))  # [batch, pos, E], like HF
        probs = self.hook_expert_weights(torch.softmax(logits.float(), dim=-1))  # [batch, pos, num_experts]
        indices = self.hook_expert_indices(probs.topk(self.top_k, dim=-1).indices)  # [batch, pos, k]
        weights = probs.gather(-1, indices)  # [batch, pos, k]: the edited indices' probs if a hook changed them
        if self.cfg.norm_topk_prob:
            weights = weights / weights.sum(-1, keepdim=True)
        return indices, weights

    def forward(self, x: Float[torch.Tensor, "batch pos d_model"]) -> Float[torch.Tensor, "batch pos d_model"]:
        indices, weights = self.route(x)
        if torch.compiler.is_compiling():
            # How many tokens each expert gets is data: traced, every routing pattern would be a graph of its own
            # (a recompile per decode step). Run eagerly, the router before it and the block after it compile once.
            # (Disabled here, not by a decorator: that would import dynamo, a second, with `hooked`.)
            eager = cast("Callable[..., torch.Tensor]", torch.compiler.disable(self.dispatch, reason="MoE dispatch"))
            return eager(x, indices, weights)
        return self.dispatch(x, indices, weights)

    def dispatch(
        self,
        x: Float[torch.Tensor, "batch pos d_model"],
        indices: Int[torch.Tensor, "batch pos k"],
        weights: Float[torch.Tensor, "batch pos k"],
    ) -> Float[torch.Tensor, "batch pos d_model"]:
        """Run each expert once on the tokens routed to it and mix their outputs by the routing weights."""
        flat = x.reshape(-1, x.shape[-1])  # [tokens, d_model]
        slots = indices.reshape(-1)  # [tokens * k]: slot s belongs to token s // k
        order = slots.argsort(stable=True)  # slots grouped by expert, tokens ascending within each
        tokens = order // self.top_k  # [tokens * k]
        counts = torch.bincount(slots, minlength=self.num_experts).tolist()
        watched = self._watched_experts() if 0 in counts else ()
        outputs = [
            expert(flat[rows])  # [n_e, d_model]
            for e, (expert, rows) in enumerate(zip(self.experts, tokens.split(counts), strict=True))
            if counts[e] or e in watched  # an expert no token reached adds nothing: skip it unless hooked
        ]
        slot_weights = weights.reshape(-1, 1)[order]  # [tokens * k, 1], float32
        if not self.cfg.moe_mix_in_fp32:  # Qwen-MoE, OLMoE: HF's router casts the weights first
            slot_weights = slot_weights.to(x.dtype)
        mixed = torch.cat(outputs) * slot_weights  # [tokens * k, d_model]: float32 with moe_mix_in_fp32
        if x.dtype == torch.float32:  # no cast to order around: one scatter-add (3x faster than the sum below)
            return torch.zeros_like(flat).index_add_(0, tokens, mixed).view(x.shape)
        by_token = torch.empty_like(mixed)
        by_token[order] = mixed  # [tokens * k, d_model]: back in (token, slot) order
        # One sum over each token's k slots, then one cast: HF's default (`grouped_mm`) experts
        return by_token.view(-1, self.top_k, x.shape[-1]).sum(1).to(x.dtype).view(x.shape)


class SharedExpertMoE(MoE):
    """Routed experts plus an always-on shared expert: Qwen2-MoE's scaled by `sigmoid(x shared_expert_gate^T)`,
    DeepSeek's and GLM's added as is (`cfg.shared_expert_gate` False). Without `cfg.shared_expert_d_mlp`
    (a subclass's routing, no shared expert) it is `MoE`."""

    def __init__(self, cfg: HookedTransformerConfig):
        super().__init__(cfg)
        if not cfg.shared_expert_d_mlp:
            return
        self.shared_expert = Expert(cfg, cfg.shared_expert_d_mlp, pos_axis=1)
        if cfg.shared_expert_gate:
            self.shared_expert_gate = nn.Linear(cfg.d_model, 1, bias=False, dtype=cfg.dtype)
            self.hook_shared_expert_gate = HookPoint()  # [batch, pos, 1]: the sigmoid gate

    def forward(self, x: Float[torch.Tensor, "batch pos d_model"]) -> Float[torch.Tensor, "batch pos d_model"]:
        if not self.cfg.shared_expert_d_mlp:
            return super().forward(x)
        shared = self.shared_expert(x)  # [batch, pos, d_model]
        routed = super().forward(x)
        if not self.cfg.shared_expert_gate:
            return routed + shared
        gate = self.hook_shared_expert_gate(torch.sigmoid(F.linear(x, self.shared_expert_gate.weight)))
        return routed + gate * shared


class GptOssMoE(MoE):
    """GPT-OSS: a biased router whose weights are a softmax over the chosen experts' logits, and clamped experts.

    The softmax runs in the logits' dtype, as HF's; the float32 probabilities over all
    experts still pass through `hook_expert_weights` and pick the experts. A hook that edits
    them also sets the weights (the chosen probabilities, renormalized), as in `MoE`.
    """

    router_bias = True
    expert_cls = ClampedSwiGLUExpert

    def route(self, x):
        logits = self.hook_router_logits(F.linear(x, self.W_gate.weight, self.W_gate.bias))  # [batch, pos, E]
        probs = torch.softmax(logits.float(), dim=-1)  # [batch, pos, num_experts]
        observed = self.hook_expert_weights.observed
        before, computed = (probs.clone() if observed else None), probs
        probs = self.hook_expert_weights(probs)
        indices = self.hook_expert_indices(probs.topk(self.top_k, dim=-1).indices)  # [batch, pos, k]
        if before is None or unedited(
            computed, before, probs
        ):  # before is None: no hook observed the weights  # HF's softmax over the top-k logits, in their dtype
            return indices, torch.softmax(logits.gather(-1, indices), dim=-1, dtype=logits.dtype)
        weights = probs.gather(-1, indices)  # [batch, pos, k]
        return indices, weights / weights.sum(-1, keepdim=True)


def make_moe(cfg: HookedTransformerConfig) -> MoE:
    """The softmax-routed mixture of experts of `cfg` (`components.moe_routing.make_moe` covers every router)."""
    if cfg.shared_expert_d_mlp:
        return SharedExpertMoE(cfg)
    return GptOssMoE(cfg) if cfg.swiglu_limit is not None else MoE(cfg)
