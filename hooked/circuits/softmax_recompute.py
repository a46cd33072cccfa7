"""AtP*'s fix for query and key nodes: recompute the attention softmax instead of linearising through it.

Patching one query (position i, head h) changes row i of the scores by `scale * dq_i . k_j`;
patching one key (position j) changes column j by `scale * q_i . dk_j`. The new pattern is
computed exactly and only the pattern's effect on the metric is linearised:

    attribution = sum over pattern entries of grad_pattern * (new pattern - corrupted pattern)

The key formula rescales each row in closed form (only entry j moves), so every (query, key)
pair is done in one `[batch, head, q_pos, k_pos]` tensor. Needs the q/k vectors that enter the
dot product: `hook_rot_q`/`hook_rot_k` on rotary layers, `hook_q`/`hook_k` elsewhere.
"""

from __future__ import annotations

import torch

from hooked.core.errors import InputError

SOFTMAX_NAMES = ("attn.hook_q", "attn.hook_k", "attn.hook_rot_q", "attn.hook_rot_k")


def check_recompute_supported(model) -> None:
    """Raise where the scores are not `scale * q . k` (+ a fixed bias) of the hooked q and k."""
    cfg = model.cfg
    if cfg.attn_scores_soft_cap > 0 or cfg.attn_sinks:
        raise InputError("recompute_softmax does not support attention soft-capping or sinks; use plain AtP")
    for block in model.blocks:
        if not block.attn.rotary and (cfg.use_qk_norm or cfg.clip_qkv is not None):
            raise InputError(
                "recompute_softmax needs the final q/k: this model normalizes or clips them after hook_q/hook_k "
                "without a rotary hook after that; use plain AtP"
            )


def _final_names(model, layer: int) -> tuple[str, str]:
    rot = "rot_" if model.blocks[layer].attn.rotary else ""
    return f"blocks.{layer}.attn.hook_{rot}q", f"blocks.{layer}.attn.hook_{rot}k"


def extra_names(model, softmax_names: list[str], with_grad: bool = False) -> list[str]:
    """Hooks the recomputation reads: final q and k (both runs), scores and pattern (corrupted run)."""
    out = []
    for name in softmax_names:
        layer = int(name.split(".")[1])
        out += list(_final_names(model, layer))
        if with_grad:
            out += [f"blocks.{layer}.attn.hook_attn_scores", f"blocks.{layer}.attn.hook_pattern"]
    return list(dict.fromkeys(out))


def recompute_attribution(model, name: str, clean_cache, acts: dict, grads: dict) -> torch.Tensor:
    """`[batch, pos, head]` (`kv_head` for grouped keys) AtP* attribution of the query or key hook `name`."""
    layer = int(name.split(".")[1])
    attn = model.blocks[layer].attn
    q_name, k_name = _final_names(model, layer)
    scores = acts[f"blocks.{layer}.attn.hook_attn_scores"].double()  # [batch, head, q_pos, k_pos]
    pattern = acts[f"blocks.{layer}.attn.hook_pattern"].double()
    grad = grads[f"blocks.{layer}.attn.hook_pattern"].double()
    q, k = acts[q_name].double(), attn.ungroup(acts[k_name]).double()  # [batch, pos, head, d_head]
    if name.endswith(("hook_q", "hook_rot_q")):
        dq = clean_cache[q_name].double() - q
        new = torch.softmax(scores + attn.scale * torch.einsum("bqhd,bkhd->bhqk", dq, k), dim=-1).nan_to_num(0.0)
        return ((new - pattern) * grad).sum(-1).transpose(1, 2).to(acts[q_name].dtype)  # [batch, q_pos, head]
    dk = attn.ungroup(clean_cache[k_name] - acts[k_name]).double()
    shift = (attn.scale * torch.einsum("bihd,bjhd->bhij", q, dk)).clamp(-80, 80)  # [batch, head, q_pos, k_pos]
    z = 1 - pattern + pattern * shift.exp()  # new row sum before renormalising
    row = (grad * pattern).sum(-1, keepdim=True)  # [batch, head, q_pos, 1]
    gp = grad * pattern
    change = gp * shift.exp() / z + (row - gp) / z - row  # [batch, head, q_pos, k_pos]
    out = change.sum(2).transpose(1, 2)  # [batch, k_pos, head]
    kv_heads = acts[k_name].shape[2]
    if kv_heads != out.shape[2]:
        out = out.reshape(*out.shape[:2], kv_heads, -1).sum(-1)  # [batch, k_pos, kv_head]
    return out.to(acts[k_name].dtype)
