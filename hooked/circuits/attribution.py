"""Attribution patching (Nanda 2023; AtP* in Kramár et al. 2024): every activation's patching effect at once.

Exact activation patching runs the corrupted input with one activation copied from the clean
run. Attribution patching estimates that effect for every element of every hooked activation
from gradients:

    "atp": grad metric(corrupted run) * (clean - corrupted)        2 forwards + 1 backward
    "ig":  mean over alpha of grad metric(corrupted run, act := corrupted + alpha (clean - corrupted))
           * (clean - corrupted)                                    `steps` forwards + backwards per hook

The baseline is the corrupted run (denoising: the estimate of metric(patched) - metric(corrupted)),
the convention of `hooked.analysis.patching`. IG uses midpoints alpha = (i + 0.5) / steps, so at a full
cut (every position of one `hook_resid_pre`) the attributions sum to metric(clean) - metric(corrupted)
up to the quadrature error. Per-head and per-position views come from the activation shapes.

AtP*'s two fixes: `recompute_softmax=True` gives each query/key node (`hook_q`/`hook_k`, one value per
batch, position and head) the effect of recomputing the attention softmax with that node patched,
linear only in the pattern; `grad_drop=True` repeats AtP once per layer with the gradient through
that layer's residual writes (`hook_attn_out`, `hook_mlp_out`) zeroed and returns
sum_l |AtP_l| / (n_layers - 1), which stops cancelling paths from hiding a node.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import torch
from jaxtyping import Float, Int

from hooked.analysis.model_kinds import ModelKinds
from hooked.circuits.softmax_recompute import (
    SOFTMAX_NAMES,
    check_recompute_supported,
    extra_names,
    recompute_attribution,
)
from hooked.core.errors import InputError

#: model classes that run `attribution_patch` themselves (`hooked.remote`'s model: on its server); the value
#: takes the model and the call's arguments in order
COMPUTED_ELSEWHERE: ModelKinds[Callable[..., dict[str, torch.Tensor]]] = ModelKinds("runs attribution_patch itself")

Metric = Callable[[Float[torch.Tensor, "batch pos d_vocab"]], Float[torch.Tensor, ""]]
LEAF_HOOKS = ("hook_embed", "hook_pos_embed")


def attribution_patch(
    model,
    clean: Int[torch.Tensor, "batch pos"],
    corrupted: Int[torch.Tensor, "batch pos"],
    metric: Metric,
    names_filter,
    method: str = "atp",
    steps: int = 32,
    sum_batch: bool = False,
    attention_mask: Int[torch.Tensor, "batch pos"] | None = None,
    recompute_softmax: bool = False,
    grad_drop: bool = False,
    steps_per_forward: int | None = None,
) -> dict[str, torch.Tensor]:
    """Estimated effect of patching each element of each hooked activation from clean into corrupted.

    Attribution patching (AtP) replaces one forward per patch with a gradient: the effect of patching
    activation `a` is about `grad metric(corrupted run) * (a_clean - a_corrupted)`. Integrated
    gradients ("ig") average the gradient along the straight path from corrupted to clean.

    Args:
        model: the `HookedTransformer`.
        clean: tokens `[batch, pos]` of the clean prompts.
        corrupted: tokens `[batch, pos]` of the corrupted prompts (same shape as `clean`).
        metric: logits `[batch, pos, d_vocab]` of the `corrupted`-sized batch -> scalar.
        names_filter: hook names: a name, a list, or a predicate (as `run_with_cache`).
        method: "atp" or "ig" (integrated gradients with `steps` points).
        steps: integration points of "ig".
        sum_batch: sum the result over the batch axis.
        attention_mask: shared padding mask `[batch, pos]` of both batches (their positions must line up).
        recompute_softmax: AtP* (method "atp" only): `hook_q`/`hook_k` get the exactly recomputed
            attention pattern; their results are then `[batch, pos, head]`.
        grad_drop: AtP*'s GradDrop (method "atp" only): sum |AtP| with each layer's residual-write
            gradient dropped in turn.
        steps_per_forward: "ig" points stacked into one batched forward (default: all).

    Returns:
        hook name -> tensor of the activation's shape (see `recompute_softmax`).
    """
    elsewhere = COMPUTED_ELSEWHERE.lookup(model)
    if elsewhere is not None:  # a hooked.remote model: the server computes it (metric: hooked.analysis.metrics)
        return elsewhere(
            model,
            clean,
            corrupted,
            metric,
            names_filter,
            method,
            steps,
            sum_batch,
            attention_mask,
            recompute_softmax,
            grad_drop,
            steps_per_forward,
        )
    if method not in ("atp", "ig"):
        raise InputError(f"method must be 'atp' or 'ig', got {method!r}")
    if method == "ig" and (recompute_softmax or grad_drop):
        raise InputError("recompute_softmax and grad_drop are AtP* options: use them with method='atp'")
    if clean.shape != corrupted.shape:
        raise InputError(f"clean {tuple(clean.shape)} and corrupted {tuple(corrupted.shape)} differ in shape")
    names = model._names_from_filter(names_filter)
    softmax_names = [n for n in names if n.endswith(SOFTMAX_NAMES)] if recompute_softmax else []
    if softmax_names:
        check_recompute_supported(model)
    cache_names = names + extra_names(model, softmax_names)
    with torch.no_grad():
        _, clean_cache = model.run_with_cache(clean, attention_mask=attention_mask, names_filter=cache_names)
    if method == "ig":
        out = {
            n: _integrated_gradients(
                model, corrupted, clean_cache[n], n, metric, attention_mask, steps, steps_per_forward
            )
            for n in names
        }
    else:
        out = _atp(model, corrupted, clean_cache, names, softmax_names, metric, attention_mask, grad_drop)
    return {n: t.sum(0) for n, t in out.items()} if sum_batch else out


def _leaf_hooks(model):
    """Make the embeddings fresh leaves: everything after them needs a gradient, no parameter gets one."""
    return [(n, lambda act, hook: act.detach().requires_grad_(True)) for n in LEAF_HOOKS if n in model.hook_dict]


def _scalar(value) -> torch.Tensor:
    if not isinstance(value, torch.Tensor) or value.numel() != 1:
        raise InputError("metric must return a scalar tensor: reduce over the batch (e.g. .mean())")
    return value.reshape(())


def _grads(model, corrupted, names, metric, attention_mask, drop_layer=None):
    """Corrupted activations and the metric's gradient at each of `names` (with layer `drop_layer`'s
    writes' gradient zeroed)."""
    acts: dict[str, torch.Tensor] = {}

    def capture(act, hook):
        acts[hook.name] = act

    hooks = _leaf_hooks(model) + [(n, capture) for n in names]
    if drop_layer is not None:
        hooks += [(f"blocks.{drop_layer}.hook_{w}", _drop_gradient) for w in model.cfg.block_writes(drop_layer)]
    with torch.enable_grad(), model.hooks(fwd_hooks=hooks):
        value = _scalar(metric(model(corrupted, attention_mask=attention_mask)))
        tensors = [acts[n] for n in names]
        grads = torch.autograd.grad(value, tensors, allow_unused=True)
    grads = {n: torch.zeros_like(t) if g is None else g for n, t, g in zip(names, tensors, grads, strict=True)}
    return {n: t.detach() for n, t in acts.items()}, grads


def _drop_gradient(act: torch.Tensor, hook) -> None:
    """GradDrop: no gradient flows back through this residual write."""
    act.register_hook(torch.zeros_like)


def _atp(model, corrupted, clean_cache, names, softmax_names, metric, attention_mask, grad_drop):
    plain = [n for n in names if n not in softmax_names]
    all_names = plain + extra_names(model, softmax_names, with_grad=True)
    layers = range(model.cfg.n_layers) if grad_drop else [None]
    total: dict[str, torch.Tensor] = {}
    for layer in layers:
        acts, grads = _grads(model, corrupted, list(dict.fromkeys(all_names)), metric, attention_mask, layer)
        out = {n: grads[n] * (clean_cache[n] - acts[n]) for n in plain}
        for n in softmax_names:
            out[n] = recompute_attribution(model, n, clean_cache, acts, grads)
        for n, t in out.items():
            total[n] = total.get(n, 0) + (t.abs() if grad_drop else t)
    if grad_drop:
        total = {n: t / max(model.cfg.n_layers - 1, 1) for n, t in total.items()}
    return {n: total[n] for n in names}


def _integrated_gradients(model, corrupted, clean_act, name, metric, attention_mask, steps, steps_per_forward):
    """IG at one hook: the corrupted run with `name` moved along the line from its corrupted to its clean value."""
    if steps < 1:
        raise InputError(f"steps must be at least 1, got {steps}")
    with torch.no_grad():
        _, cache = model.run_with_cache(corrupted, attention_mask=attention_mask, names_filter=[name])
    start, delta = cache[name], clean_act - cache[name]
    grad_sum = torch.zeros_like(start)
    alphas = (torch.arange(steps, dtype=torch.float32) + 0.5) / steps
    for chunk in alphas.split(steps_per_forward or steps):
        k, leaf = len(chunk), []
        a = chunk.to(start.device, start.dtype).view(k, *([1] * start.ndim))

        def interpolate(act, hook, a=a, leaf=leaf):
            leaf.append((start[None] + a * delta[None]).flatten(0, 1).requires_grad_(True))  # [k * batch, ...]
            return leaf[-1]

        mask = None if attention_mask is None else attention_mask.repeat(k, 1)
        with torch.enable_grad(), model.hooks(fwd_hooks=[(name, interpolate)]):
            logits = model(corrupted.repeat(k, 1), attention_mask=mask)
            # sum() of tensors is typed `Tensor | Literal[0]`; it is a tensor here (k >= 1)
            value = cast(torch.Tensor, sum(_scalar(metric(part)) for part in logits.chunk(k)))
            (grad,) = torch.autograd.grad(value, leaf)
        grad_sum += grad.view(k, *start.shape).sum(0)
    return grad_sum / steps * delta
