"""What the server does with a decoded request: validate it, estimate its cost, then call the model.

Every field is read through the request schema (`hooked.serve.schema`); hook names must be keys
of `model.hook_dict`; hooks are rebuilt only from `hooked.analysis.interventions` specs, metrics
only from `hooked.analysis.metrics` specs, patch setters only from `hooked.analysis.patching`'s own
list. Nothing a request says is imported, evaluated or unpickled. Before a job is queued its
cost is estimated (`hooked.serve.costs`) and checked against the server's budgets, and every
intervention tensor is checked against the shape of the activation it edits, so nothing is
allocated for a request the server will refuse. Once running, a job checks its deadline in
every forward (`_guarded`), so it never runs more than one forward past its timeout.
"""

from __future__ import annotations

import contextlib
import functools
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from hooked.analysis import interventions, metrics, patching
from hooked.core.errors import HookedError, WireError
from hooked.core.utils import get_act_name
from hooked.generation.options import GenerationOptions, check_eos_in_vocab
from hooked.serve import costs, schema
from hooked.serve.scheduler import Job

#: `hooked.analysis.patching` sweeps a client may ask for, by name (the only ones the server runs).
PATCH_FUNCTIONS = {name: getattr(patching, name) for name in dir(patching) if name.startswith("get_act_patch_")}
#: The sweeps each `*_every` function runs (the others are `functools.partial`s of one sweep).
EVERY_SWEEPS = {
    "get_act_patch_block_every": ("resid_pre", "attn_out", "mlp_out"),
    "get_act_patch_attn_head_all_pos_every": ("z", "q", "k", "v", "pattern"),
    "get_act_patch_attn_head_by_pos_every": ("z", "q", "k", "v", "pattern"),
}
SETTERS = {
    fn.__name__: fn
    for fn in (
        patching.layer_pos_patch_setter,
        patching.layer_pos_head_vector_patch_setter,
        patching.layer_head_vector_patch_setter,
        patching.layer_head_pattern_patch_setter,
        patching.layer_head_pos_pattern_patch_setter,
        patching.layer_head_dest_src_pos_pattern_patch_setter,
    )
}
AXES = {"layer", "pos", "head", "head_index", "dest_pos", "src_pos"}
ACTIVATION_NAMES = {
    "resid_pre",
    "resid_mid",
    "resid_post",
    "attn_out",
    "mlp_out",
    "z",
    "q",
    "k",
    "v",
    "pattern",
    "attn_scores",
    "result",
    "pre",
    "post",
}
#: Field names of each operation (read from the schema; kept for code that imported them).
FORWARD_FIELDS = schema.FORWARD.field_names
GENERATE_FIELDS = schema.GENERATE.field_names
PATCH_FIELDS = schema.PATCH.field_names
ATTRIBUTION_FIELDS = schema.ATTRIBUTION.field_names


@dataclass(frozen=True)
class ServeLimits:
    """Per-request limits of `hooked serve` (its options set them)."""

    max_tokens_per_request: int = 8192  # batch * pos of one request, generated tokens included
    max_new_tokens: int = 512
    max_cache_names: int = 8192
    max_hooks: int = 256
    max_patch_rows: int = 100_000
    max_chunk: int = 1024  # index rows per step of the generic sweep (progress is reported between steps)
    max_request_memory: int | None = None  # bytes one request may use while it runs (None: derived at start)
    max_answer_bytes: int | None = None  # bytes of one answer (None: derived at start)


@dataclass
class Context:
    """What every operation reads besides its request: the model, the limits, the activation sizes.

    `sizes` is None on the other ranks of a pipeline, which run what rank 0 admitted.
    """

    model: Any
    limits: ServeLimits
    sizes: costs.ActivationSizes | None = None

    def admit(self, cost: costs.Cost | None, hint: str = "") -> None:
        if cost is None or self.limits.max_request_memory is None or self.limits.max_answer_bytes is None:
            return
        costs.admit(cost, costs.Budget(self.limits.max_request_memory, self.limits.max_answer_bytes), hint)


def check_fields(body: dict, allowed: set[str]) -> None:
    unknown = set(body) - allowed
    if unknown:
        raise WireError(f"unknown field(s) {sorted(unknown)!r:.200}; accepted: {sorted(allowed)}", 422)


def check_tokens(model, tensors: dict, name: str, limits: ServeLimits, extra: int = 0) -> torch.Tensor:
    """Token ids `[batch, pos]` within the vocabulary and the size limits."""
    t = tensors.get(name)
    if t is None:
        raise WireError(f"the request has no {name!r} tensor", 422)
    if t.dtype not in (torch.int64, torch.int32) or t.ndim != 2 or 0 in t.shape:
        raise WireError(f"{name!r} must be int64 token ids [batch, pos], got {t.dtype} {tuple(t.shape)}", 422)
    if t.numel() + t.shape[0] * extra > limits.max_tokens_per_request:
        raise WireError(
            f"{name!r} has {t.numel()} tokens (+{t.shape[0] * extra} to generate): the limit per request "
            f"is {limits.max_tokens_per_request} (--max-tokens-per-request)",
            413,
        )
    if t.shape[1] + extra > model.cfg.n_ctx:
        raise WireError(
            f"{name!r} has {t.shape[1]} positions (+{extra}), more than the context of {model.cfg.n_ctx}", 422
        )
    if int(t.min()) < 0 or int(t.max()) >= model.cfg.d_vocab:
        raise WireError(f"{name!r} holds ids outside [0, {model.cfg.d_vocab})", 422)
    return t.long()


def check_mask(tensors: dict, name: str, tokens: torch.Tensor) -> torch.Tensor | None:
    m = tensors.get(name)
    if m is None:
        return None
    if m.shape != tokens.shape or m.dtype not in (torch.int64, torch.int32, torch.bool, torch.uint8):
        raise WireError(f"{name!r} must be a 0/1 mask of the tokens' shape {tuple(tokens.shape)}", 422)
    if not bool(((m == 0) | (m == 1)).all()):
        raise WireError(f"{name!r} must hold only 0 and 1", 422)
    return m.long()


def check_names(model, names, what: str, limit: int) -> list[str]:
    if not isinstance(names, list) or len(names) > limit or not all(isinstance(n, str) for n in names):
        raise WireError(f"{what} must be a list of at most {limit} hook names", 422)
    unknown = [n for n in names if n not in model.hook_dict]
    if unknown:
        raise WireError(f"{what}: no hook point(s) {unknown[:5]!r:.200} in this model (see GET /v1/model)", 422)
    return names


def build_hooks(ctx: Context, specs: list, tensors: dict, batch: int = 1, pos: int = 1) -> list[tuple[str, Any]]:
    """`(name, intervention)` pairs from the request's specs, each tensor checked against its activation."""
    if len(specs) > ctx.limits.max_hooks:
        raise WireError(f"hooks must be a list of at most {ctx.limits.max_hooks} entries", 422)
    hooks = []
    for i, item in enumerate(specs):
        if not isinstance(item, dict) or set(item) != {"name", "hook"}:
            raise WireError(f"hooks[{i}] must be {{'name': hook name, 'hook': intervention spec}}", 422)
        (name,) = check_names(ctx.model, [item["name"]], f"hooks[{i}].name", 1)
        try:
            hook = interventions.from_spec(item["hook"], tensors)
        except HookedError as e:
            raise WireError(f"hooks[{i}] ({name}): {e}", 422) from None
        if ctx.sizes is not None:
            _check_edit_tensors(ctx.sizes, name, hook, batch, pos, f"hooks[{i}] ({name})")
        hooks.append((name, hook))
    return hooks


def _check_edit_tensors(sizes: costs.ActivationSizes, name: str, hook, batch: int, pos: int, where: str) -> None:
    """An intervention's tensors fit its activation without enlarging it (a 422 before anything is allocated)."""
    act = sizes.shape(name, batch, pos)
    if act is None:
        return  # a hook point whose shape depends on the data: checked when the hook runs
    for item in hook.items if isinstance(hook, interventions.Chain) else [hook]:
        for key in type(item).tensors:
            t = getattr(item, key)
            if t is None:
                continue
            if isinstance(item, interventions.ProjectOut):
                ok = tuple(t.shape) == act[-1:]
            elif isinstance(item, interventions.PatchCache):
                ok = tuple(t.shape) == act
            else:
                try:
                    ok = tuple(torch.broadcast_shapes(t.shape, act)) == act
                except RuntimeError:
                    ok = False
            if not ok:
                raise WireError(
                    f"{where}: {item.op} {key} has shape {tuple(t.shape)}, which does not fit the activation "
                    f"{act} without changing its shape",
                    422,
                )


def read_metric(ctx: Context, body: dict, tensors: dict, pos: int) -> metrics.Metric:
    """The request's metric, its position and token ids checked against the input and the vocabulary."""
    try:
        metric = metrics.from_spec(body.get("metric"), tensors)
    except HookedError as e:
        raise WireError(str(e), 422) from None
    p = getattr(metric, "pos", -1)
    if not -pos <= p < pos:
        raise WireError(f"metric position {p} is outside the {pos} positions of the input", 422)
    n_out = ctx.model.cfg.d_vocab_out
    ids = [*getattr(metric, "correct", []), *getattr(metric, "incorrect", [])]
    ids += [metric.token] if isinstance(metric, metrics.LogProb) else []
    if any(i >= n_out for i in ids):
        raise WireError(f"metric token id {max(ids)} is outside the vocabulary of {n_out}", 422)
    if isinstance(metric, metrics.Projection) and metric.direction.shape[0] != n_out:
        raise WireError(f"metric direction has {metric.direction.shape[0]} entries; the logits have {n_out}", 422)
    return metric


@contextlib.contextmanager
def _deadline_checks(model, job: Job) -> Iterator[None]:
    """`job.check()` at the start of every forward and of every block: a job stops within one block
    of its deadline (or its cancellation, or a shutdown), whatever operation it runs."""
    modules = [model, *getattr(model, "blocks", [])]
    handles = [m.register_forward_pre_hook(lambda *_: job.check()) for m in modules]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _guarded(model, run):
    """`run(job)` with the deadline checked in every forward."""

    @functools.wraps(run)
    def guarded(job: Job):
        with _deadline_checks(model, job):
            return run(job)

    return guarded


# -- forward -----------------------------------------------------------------------------------
def forward_job(ctx: Context, user: str, body: dict, tensors: dict) -> Job:
    values = schema.FORWARD.read(body)
    model = ctx.model
    tokens = check_tokens(model, tensors, "tokens", ctx.limits)
    mask = check_mask(tensors, "attention_mask", tokens)
    batch, pos = tokens.shape
    hooks = build_hooks(ctx, values["hooks"], tensors, batch, pos)
    cache = values["cache"]
    names = None if cache is None else check_names(model, cache, "cache", ctx.limits.max_cache_names)
    want_logits = values["return_logits"]
    cost = None
    if ctx.sizes is not None:
        cost = costs.forward_cost(ctx.sizes, batch, pos, names or [], [n for n, _ in hooks], want_logits)
    ctx.admit(cost, ": cache fewer hook points or send fewer tokens")

    def run(job: Job):
        with torch.inference_mode(), model.hooks(hooks):
            if names is None:
                logits = model(tokens, attention_mask=mask)
                cache_dict = {}
            else:
                logits, cache_dict = model.run_with_cache(
                    tokens, attention_mask=mask, names_filter=names, return_cache_object=False
                )
        out = {f"cache/{k}": v for k, v in cache_dict.items()}
        if want_logits:
            out["logits"] = logits
        return {"cache": list(cache_dict)}, out

    plain = not hooks and names is None and mask is None and want_logits
    key = ("forward", pos) if plain else None
    return Job(
        user, "forward", _guarded(model, run), tokens=tokens.numel(), batch_key=key, batch_input=tokens, cost=cost
    )


def run_batched_forward(model, jobs: list[Job]) -> list[Any]:
    """Compatible plain forwards (same length) as one batch, split back row-wise."""
    stacked = torch.cat([j.batch_input for j in jobs], dim=0)  # [sum of batches, pos]
    with torch.inference_mode():
        logits = model(stacked)
    out, start = [], 0
    for j in jobs:
        n = j.batch_input.shape[0]
        out.append(({"cache": []}, {"logits": logits[start : start + n]}))
        start += n
    return out


# -- generate ----------------------------------------------------------------------------------
def generation_options(ctx: Context, values: dict, hooks: list, names: list[str] | None) -> GenerationOptions:
    """The `GenerationOptions` of a request: its option fields, checked as a local `generate` checks them."""
    try:
        options = GenerationOptions(
            **{k: values[k] for k in schema.GENERATION_FIELDS},
            fwd_hooks=hooks,
            names_filter=names,
            verbose=False,
            return_type="tokens",
        )
        check_eos_in_vocab(options.eos_token_id, ctx.model.cfg.d_vocab)
    except HookedError as e:
        raise WireError(str(e), 422) from None
    return options


def generate_job(ctx: Context, user: str, body: dict, tensors: dict) -> Job:
    model = ctx.model
    bounds = {"max_new_tokens": (1, ctx.limits.max_new_tokens), "top_k": (1, model.cfg.d_vocab)}
    values = schema.GENERATE.read(body, bounds)
    n_new = values["max_new_tokens"]
    tokens = check_tokens(model, tensors, "tokens", ctx.limits, extra=n_new)
    mask = check_mask(tensors, "attention_mask", tokens)
    batch, pos = tokens.shape
    hooks = build_hooks(ctx, values["hooks"], tensors, batch, pos)
    names = values["names_filter"]
    names = None if names is None else check_names(model, names, "names_filter", ctx.limits.max_cache_names)
    options = generation_options(ctx, values, hooks, names)
    cost = None
    if ctx.sizes is not None:
        kv = [n for n in ctx.sizes.hooks if n.endswith(("attn.hook_k", "attn.hook_v"))]
        recorded = (list(ctx.sizes.hooks) if names is None else names) if options.return_cache else []
        cost = costs.generate_cost(
            ctx.sizes, batch, pos, n_new, kv, recorded, options.output_logits, options.use_past_kv_cache
        )
    ctx.admit(cost, ": ask for fewer new tokens, a shorter prompt or fewer cached hook points")

    def run(job: Job):
        stream = model.generate_stream(tokens, attention_mask=mask, max_tokens_per_yield=1, options=options)
        out = _generation_answer(_stream_steps(stream, job), options)
        return {"cache": [k[6:] for k in out if k.startswith("cache/")]}, out

    return Job(user, "generate", _guarded(model, run), tokens=tokens.numel() + batch * n_new, cost=cost)


def _stream_steps(stream, job: Job):
    """Run a `generate_stream`, emitting each step's tokens; its return value."""
    step = 0
    try:
        while True:
            job.check()
            try:
                chunk = next(stream)
            except StopIteration as done:
                return done.value
            job.emit({"step": step, "tokens": chunk[:, 0].tolist()})
            step += 1
    finally:
        stream.close()


def _generation_answer(result, options: GenerationOptions) -> dict[str, torch.Tensor]:
    if not (options.return_cache or options.output_logits):
        return {"sequences": result}
    out = {"sequences": result.sequences, "attention_mask": result.attention_mask, "finished": result.finished}
    if result.cache is not None:
        out.update({f"cache/{k}": v for k, v in result.cache.cache_dict.items()})
        if result.cache.tokens is not None:
            out["cache_tokens"] = result.cache.tokens
        out["cache_attention_mask"] = result.cache.attention_mask
    if result.logits is not None:
        out["logits"] = torch.stack(list(result.logits), 1)  # [batch, new, d_vocab]
    return out


# -- patching sweeps ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Sweep:
    """What a patching request runs: one generic sweep, or a named function's sweeps."""

    function: Any  # a get_act_patch_* function, or None for the generic sweep
    activations: tuple[str, ...]
    patches: tuple[int, ...]  # patches of each sweep

    def cached_names(self, model) -> list[str]:
        """The clean activations the sweeps read (cached once, before them)."""
        names = [get_act_name(a, layer=layer) for a in self.activations for layer in range(model.cfg.n_layers)]
        return [n for n in names if n in model.hook_dict]


def _named_sweep(model, name: str, corrupted: torch.Tensor) -> Sweep:
    if name not in PATCH_FUNCTIONS:
        raise WireError(f"unknown patching function {name!r:.60}; known: {sorted(PATCH_FUNCTIONS)}", 422)
    fn = PATCH_FUNCTIONS[name]
    parts = [fn] if isinstance(fn, functools.partial) else [PATCH_FUNCTIONS[n] for n in _every_parts(name)]
    acts, patches = [], []
    for part in parts:
        kw = part.keywords
        ranges = patching.axis_ranges(model, corrupted, kw["activation_name"])
        acts.append(kw["activation_name"])
        patches.append(math.prod(ranges[a] for a in kw["index_axis_names"]))
    return Sweep(fn, tuple(dict.fromkeys(acts)), tuple(patches))


def _every_parts(name: str) -> list[str]:
    """The `get_act_patch_*` partials a `*_every` function calls."""
    if name not in EVERY_SWEEPS:
        raise WireError(f"patching function {name!r} cannot run on a server", 422)
    kind = "all_pos" if "all_pos" in name else "by_pos"
    acts = EVERY_SWEEPS[name]
    if name == "get_act_patch_block_every":
        return [f"get_act_patch_{a}" for a in acts]
    return [f"get_act_patch_attn_head_{'out' if a == 'z' else a}_{kind}" for a in acts]


def _generic_sweep(model, values: dict, corrupted: torch.Tensor, index: torch.Tensor | None) -> tuple[Sweep, Any]:
    setter = SETTERS.get(values["setter"]) if isinstance(values["setter"], str) else None
    activation = values["activation"]
    if setter is None or activation not in ACTIVATION_NAMES:
        raise WireError(f"setter must be one of {sorted(SETTERS)}; activation one of {sorted(ACTIVATION_NAMES)}", 422)
    axes = values["axes"]
    if axes is not None and (not set(axes) <= AXES or len(axes) > 4 or not all(isinstance(a, str) for a in axes)):
        raise WireError(f"axes must be a list of {sorted(AXES)}", 422)
    if index is None and axes is None:
        raise WireError("pass axes or an index tensor", 422)
    if index is not None:
        patches = index.shape[0]
    else:
        ranges = patching.axis_ranges(model, corrupted, activation)
        patches = math.prod(ranges[a] for a in axes or ())
    return Sweep(None, (activation,), (patches,)), setter


def _per_forward(model, corrupted: torch.Tensor, sweep: Sweep, batch_size: int | None, chunk: int) -> int:
    """Patches per forward: the client's `batch_size`, else what `auto_batch_size` picks (as a local call)."""
    if batch_size is not None:
        return batch_size
    if sweep.function is None:  # the server runs the generic sweep `chunk` rows at a time
        return patching.auto_batch_size(model, corrupted, min(chunk, sweep.patches[0]))
    return max(patching.auto_batch_size(model, corrupted, n) for n in sweep.patches)


def patch_job(ctx: Context, user: str, body: dict, tensors: dict) -> Job:
    """A `hooked.analysis.patching` sweep: a named `get_act_patch_*` function, or the generic sweep with a
    named setter; index rows (optional tensor `index`) and clean inputs come as tensors."""
    model = ctx.model
    values = schema.PATCH.read(body)
    corrupted = check_tokens(model, tensors, "tokens", ctx.limits)
    clean = check_tokens(model, tensors, "clean_tokens", ctx.limits)
    clean_mask = check_mask(tensors, "clean_attention_mask", clean)
    if clean.shape[1] != corrupted.shape[1]:
        raise WireError("clean and corrupted tokens must have the same length", 422)
    metric = read_metric(ctx, body, tensors, corrupted.shape[1])
    index = tensors.get("index")
    if index is not None and (
        index.dtype != torch.int64 or index.ndim != 2 or index.shape[0] > ctx.limits.max_patch_rows
    ):
        raise WireError(f"index must be int64 [rows <= {ctx.limits.max_patch_rows}, axes]", 422)
    chunk = min(values["chunk"], ctx.limits.max_chunk)  # only the progress reports' spacing: results are the same
    if values["function"] is not None:
        sweep, setter = _named_sweep(model, values["function"], corrupted), None
    else:
        sweep, setter = _generic_sweep(model, values, corrupted, index)
    per_forward = _per_forward(model, corrupted, sweep, values["batch_size"], chunk)
    cost = _sweep_cost(ctx, sweep, clean, corrupted, per_forward)
    run = _sweep_run(model, sweep, setter, values, (corrupted, clean, clean_mask, index), metric, chunk)
    return Job(user, "patch", _guarded(model, run), tokens=corrupted.numel() + clean.numel(), cost=cost)


def _sweep_cost(ctx: Context, sweep: Sweep, clean, corrupted, per_forward: int) -> costs.Cost | None:
    if ctx.sizes is None:
        return None
    sizes, names = ctx.sizes, sweep.cached_names(ctx.model)
    batch, pos = corrupted.shape

    def cost_at(n: int) -> costs.Cost:
        patched = [name for name in names if name.startswith("blocks.0.")]
        return costs.patch_cost(sizes, (batch, clean.shape[0]), pos, names, patched, sum(sweep.patches), n)

    cost = cost_at(per_forward)
    ctx.admit(cost, _smaller_hint(ctx, cost_at, per_forward, "batch_size"))
    return cost


def _smaller_hint(ctx: Context, cost_at, current: int, option: str) -> str:
    """': pass option=N' with the largest N below `current` whose cost fits, if any does."""
    budget = ctx.limits.max_request_memory
    if budget is None:
        return ""
    fits = [n for n in range(current - 1, 0, -max(1, current // 64)) if cost_at(n).peak_bytes <= budget]
    return f": pass {option}={fits[0]} (or less)" if fits else ": send fewer or shorter prompts"


def _sweep_run(model, sweep: Sweep, setter, values: dict, inputs, metric, chunk: int):
    corrupted, clean, clean_mask, index = inputs
    batch_size = values["batch_size"]

    def run(job: Job):
        with torch.inference_mode():
            _, cache = model.run_with_cache(clean, attention_mask=clean_mask, names_filter=sweep.cached_names(model))
            job.check()
            if sweep.function is not None:
                kwargs = {} if batch_size is None else {"batch_size": batch_size}
                result = sweep.function(model, corrupted, cache, metric, verbose=False, **kwargs)
                job.emit({"progress": 1.0})
            else:
                axes = values["axes"]
                result = _sweep_generic(model, setter, sweep.activations[0], axes, index, corrupted, cache, metric)(
                    batch_size, chunk, job
                )
        return {}, {"result": result}

    return run


def _sweep_generic(model, setter, activation, axes, index, corrupted, cache, metric):
    """`generic_activation_patch` over chunks of index rows, reporting progress between chunks."""
    if index is None:
        ranges = patching.axis_ranges(model, corrupted, activation)
        shape = [ranges[a] for a in axes]
        grids = torch.meshgrid(*[torch.arange(n) for n in shape], indexing="ij")
        rows = torch.stack([g.reshape(-1) for g in grids], dim=1)  # [prod(shape), n_axes]
    else:
        shape, rows = None, index

    def sweep(batch_size, chunk: int, job: Job) -> torch.Tensor:
        values = []
        for start in range(0, rows.shape[0], chunk):
            job.check()
            part = rows[start : start + chunk]
            values.append(
                patching.generic_activation_patch(
                    model,
                    corrupted,
                    cache,
                    metric,
                    setter,
                    activation,
                    index_df=part,
                    batch_size=batch_size,
                    verbose=False,
                )  # fmt: skip
            )
            job.emit({"progress": min(1.0, (start + part.shape[0]) / rows.shape[0])})
        out = torch.cat(values) if values else torch.zeros(0)
        return out.reshape(shape) if shape is not None else out

    return sweep


# -- attribution patching ------------------------------------------------------------------------
def attribution_job(ctx: Context, user: str, body: dict, tensors: dict) -> Job:
    model = ctx.model
    values = schema.ATTRIBUTION.read(body)
    clean = check_tokens(model, tensors, "clean_tokens", ctx.limits)
    corrupted = check_tokens(model, tensors, "tokens", ctx.limits)
    if clean.shape != corrupted.shape:
        raise WireError(f"clean {tuple(clean.shape)} and corrupted {tuple(corrupted.shape)} differ in shape", 422)
    mask = check_mask(tensors, "attention_mask", corrupted)
    names = check_names(model, values["names"], "names", ctx.limits.max_cache_names)
    metric = read_metric(ctx, body, tensors, corrupted.shape[1])
    method, steps = values["method"], values["steps"]
    if method not in ("atp", "ig"):
        raise WireError("method must be 'atp' or 'ig'", 422)
    per_forward = min(values["steps_per_forward"] or steps, steps)
    cost = _attribution_cost(ctx, corrupted, names, values, per_forward)
    kwargs = {k: values[k] for k in ("method", "steps", "sum_batch", "recompute_softmax", "grad_drop")}

    def run(job: Job):
        from hooked.circuits.attribution import attribution_patch

        out = attribution_patch(
            model, clean, corrupted, metric, names, attention_mask=mask, steps_per_forward=per_forward, **kwargs
        )
        return {"names": list(out)}, {f"attr/{k}": v for k, v in out.items()}

    forwards = steps if method == "ig" else 2
    return Job(
        user, "attribution", _guarded(model, run), tokens=clean.numel() + corrupted.numel() * forwards, cost=cost
    )


def _attribution_cost(ctx: Context, corrupted, names: list[str], values: dict, per_forward: int) -> costs.Cost | None:
    sizes = ctx.sizes
    if sizes is None:
        return None
    batch, pos = corrupted.shape
    method, steps = values["method"], values["steps"]
    drops = ctx.model.cfg.n_layers if values["grad_drop"] else 1
    cached = list(sizes.hooks) if values["recompute_softmax"] else names  # AtP* caches q, k and the patterns too

    def cost_at(k: int) -> costs.Cost:
        return costs.attribution_cost(sizes, batch, pos, cached, method, steps, k, drops)

    cost = cost_at(per_forward)
    hint = _smaller_hint(ctx, cost_at, per_forward, "steps_per_forward") if method == "ig" else ""
    ctx.admit(cost, hint or ": send fewer or shorter prompts, or fewer hook points")
    return cost


# -- inspect and weights -----------------------------------------------------------------------
def inspect_job(ctx: Context, user: str, prompt: str) -> Job:
    """`hooked inspect --html`'s page of `prompt`, its length and cost checked first."""
    from hooked.viz.attention import MAX_POS

    model = ctx.model
    n = int(model.to_tokens(prompt, truncate=False).shape[1])
    if n > min(model.cfg.n_ctx, ctx.limits.max_tokens_per_request):
        raise WireError(
            f"the prompt is {n} tokens; the limit is {min(model.cfg.n_ctx, ctx.limits.max_tokens_per_request)} "
            "(the model's context, and --max-tokens-per-request)",
            413,
        )
    cost = None if ctx.sizes is None else costs.inspect_cost(ctx.sizes, n, model.cfg.n_heads, MAX_POS)
    ctx.admit(cost, ": shorten the prompt")
    return Job(user, "inspect", _guarded(model, lambda job: inspect_html(model, prompt)), tokens=n, cost=cost)


def weights_job(ctx: Context, user: str, part: str) -> Job:
    check_part(ctx.model, part)
    module = ctx.model.blocks[int(part.split(".")[1])] if part.startswith("blocks.") else getattr(ctx.model, part)
    nbytes = sum(t.numel() * t.element_size() for t in module.state_dict().values())
    cost = costs.weights_cost(nbytes)
    ctx.admit(cost)
    return Job(user, "weights", lambda job: weights_of(ctx.model, part), cost=cost)


PREPARE = {"forward": forward_job, "generate": generate_job, "patch": patch_job, "attribution": attribution_job}
OPS = PREPARE  # (the name before the request schema)


def make_job(ctx: Context, user: str, body: dict, tensors: dict) -> Job:
    """The job of a decoded request: validated, its cost estimated and admitted, ready to queue."""
    op = schema.op_of(body)
    schema.check_tensor_names(tensors)
    return PREPARE[op.name](ctx, user, body, tensors)


WEIGHT_PART = re.compile(r"^(blocks\.(0|[1-9][0-9]{0,4})|unembed|ln_final|embed|pos_embed)$")


def check_part(model, part: str) -> None:
    """`part` names a block or a non-block part this model has."""
    if not WEIGHT_PART.match(part):
        raise WireError(f"part must be blocks.<n>, unembed, ln_final, embed or pos_embed, got {part!r:.40}", 422)
    if part.startswith("blocks.") and int(part.split(".")[1]) >= model.cfg.n_layers:
        raise WireError(f"layer {part.split('.')[1]} out of range (n_layers = {model.cfg.n_layers})", 422)
    if not part.startswith("blocks.") and not hasattr(model, part):
        raise WireError(f"this model has no {part!r}", 404)


def weights_of(model, part: str) -> dict[str, torch.Tensor]:
    """The parameters and persistent buffers of `part` (`blocks.3`, `unembed`, `ln_final`, ...).

    Read through `model.block_weight` / `part_weight`, so a pipeline fetches them from their rank
    (a collective: every rank calls this for the same part).
    """
    check_part(model, part)
    if part.startswith("blocks."):
        layer = int(part.split(".")[1])
        keys = list(model.blocks[layer].state_dict())
        return {k: model.block_weight(layer, k).detach() for k in keys}
    keys = list(getattr(model, part).state_dict())
    return {k: model.part_weight(part, k).detach() for k in keys}


def inspect_html(model, prompt: str) -> str:
    """`hooked inspect --html`'s page for `prompt`."""
    from hooked.viz.report import prompt_views

    return prompt_views(model, prompt).html


__all__ = [
    "ACTIVATION_NAMES",
    "AXES",
    "Context",
    "OPS",
    "PATCH_FUNCTIONS",
    "SETTERS",
    "ServeLimits",
    "WEIGHT_PART",
    "attribution_job",
    "build_hooks",
    "check_fields",
    "check_mask",
    "check_names",
    "check_part",
    "check_tokens",
    "forward_job",
    "generate_job",
    "inspect_html",
    "inspect_job",
    "make_job",
    "patch_job",
    "read_metric",
    "run_batched_forward",
    "weights_job",
    "weights_of",
]
