"""What the server does with a decoded request: validate it field by field, then call the model.

Every field is checked against a fixed schema (`_field`); hook names must be keys of
`model.hook_dict`; hooks are rebuilt only from `hooked.analysis.interventions` specs, metrics only
from `hooked.analysis.metrics` specs, patch setters only from `hooked.analysis.patching`'s own list. Nothing a
request says is imported, evaluated or unpickled.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal, TypeVar, overload

import torch

from hooked.analysis import interventions, metrics, patching
from hooked.core.errors import HookedError
from hooked.serve.scheduler import Job
from hooked.serve.wire import WireError

#: `hooked.analysis.patching` sweeps a client may ask for, by name (the only ones the server runs).
PATCH_FUNCTIONS = {name: getattr(patching, name) for name in dir(patching) if name.startswith("get_act_patch_")}
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
WEIGHT_PART = re.compile(r"^(blocks\.(0|[1-9][0-9]{0,4})|unembed|ln_final|embed|pos_embed)$")


@dataclass(frozen=True)
class ServeLimits:
    max_tokens_per_request: int = 8192  # batch * pos of one request, generated tokens included
    max_new_tokens: int = 512
    max_cache_names: int = 8192
    max_hooks: int = 256
    max_patch_rows: int = 100_000


T = TypeVar("T")


@overload
def _field(body: dict, key: str, kind: type[T], default: T, *, required: bool = ..., lo=..., hi=...) -> T: ...
@overload
def _field(
    body: dict, key: str, kind: type[T], default: None = ..., *, required: Literal[True], lo=..., hi=...
) -> T: ...
@overload
def _field(body: dict, key: str, kind: Any, default: Any = ..., *, required: bool = ..., lo=..., hi=...) -> Any: ...
def _field(body: dict, key: str, kind, default=None, *, required=False, lo=None, hi=None):
    """`body[key]` if it has type `kind` (and lies in [lo, hi]); a 422 naming the field otherwise."""
    if key not in body or body[key] is None:
        if required:
            raise WireError(f"missing field {key!r}", 422)
        return default
    value = body[key]
    ok = isinstance(value, kind) and not (isinstance(value, bool) and kind in (int, float, (int, float)))
    if not ok:
        raise WireError(f"field {key!r} must be {getattr(kind, '__name__', kind)}, got {type(value).__name__}", 422)
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise WireError(f"field {key!r} = {value} is outside [{lo}, {hi}]", 422)
    return value


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
            f"is {limits.max_tokens_per_request}",
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


def build_hooks(model, body: dict, tensors: dict, limits: ServeLimits) -> list[tuple[str, Any]]:
    specs = body.get("hooks") or []
    if not isinstance(specs, list) or len(specs) > limits.max_hooks:
        raise WireError(f"hooks must be a list of at most {limits.max_hooks} entries", 422)
    hooks = []
    for i, item in enumerate(specs):
        if not isinstance(item, dict) or set(item) != {"name", "hook"}:
            raise WireError(f"hooks[{i}] must be {{'name': hook name, 'hook': intervention spec}}", 422)
        (name,) = check_names(model, [item["name"]], f"hooks[{i}].name", 1)
        try:
            hooks.append((name, interventions.from_spec(item["hook"], tensors)))
        except HookedError as e:
            raise WireError(f"hooks[{i}] ({name}): {e}", 422) from None
    return hooks


def _metric(body: dict, tensors: dict):
    try:
        return metrics.from_spec(body.get("metric"), tensors)
    except HookedError as e:
        raise WireError(str(e), 422) from None


# -- forward -----------------------------------------------------------------------------------
FORWARD_FIELDS = {"op", "hooks", "cache", "return_logits"}


def forward_job(model, user: str, body: dict, tensors: dict, limits: ServeLimits) -> Job:
    check_fields(body, FORWARD_FIELDS)
    tokens = check_tokens(model, tensors, "tokens", limits)
    mask = check_mask(tensors, "attention_mask", tokens)
    hooks = build_hooks(model, body, tensors, limits)
    cache = body.get("cache")
    names = None if cache is None else check_names(model, cache, "cache", limits.max_cache_names)
    want_logits = _field(body, "return_logits", bool, True)

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
    key = ("forward", tokens.shape[1]) if plain else None
    return Job(user, "forward", run, tokens=tokens.numel(), batch_key=key, batch_input=tokens)


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
GENERATE_FIELDS = {
    "op",
    "hooks",
    "max_new_tokens",
    "do_sample",
    "temperature",
    "top_k",
    "top_p",
    "seed",
    "stop_at_eos",
    "use_past_kv_cache",
    "return_cache",
    "names_filter",
    "freq_penalty",
    "repetition_penalty",
    "output_logits",
}


def generate_job(model, user: str, body: dict, tensors: dict, limits: ServeLimits) -> Job:
    check_fields(body, GENERATE_FIELDS)
    n_new = _field(body, "max_new_tokens", int, 10, lo=1, hi=limits.max_new_tokens)
    tokens = check_tokens(model, tensors, "tokens", limits, extra=n_new)
    mask = check_mask(tensors, "attention_mask", tokens)
    hooks = build_hooks(model, body, tensors, limits)
    names = body.get("names_filter")
    names = None if names is None else check_names(model, names, "names_filter", limits.max_cache_names)
    kwargs = dict(
        max_new_tokens=n_new,
        do_sample=_field(body, "do_sample", bool, True),
        temperature=_field(body, "temperature", (int, float), 1.0, lo=0.0, hi=100.0),
        top_k=_field(body, "top_k", int, None, lo=1, hi=model.cfg.d_vocab),
        top_p=_field(body, "top_p", (int, float), None, lo=0.0, hi=1.0),
        seed=_field(body, "seed", int, None, lo=0, hi=2**63 - 1),
        stop_at_eos=_field(body, "stop_at_eos", bool, True),
        use_past_kv_cache=_field(body, "use_past_kv_cache", bool, True),
        freq_penalty=_field(body, "freq_penalty", (int, float), 0.0, lo=-100.0, hi=100.0),
        repetition_penalty=_field(body, "repetition_penalty", (int, float), 1.0, lo=0.0, hi=100.0),
        return_cache=_field(body, "return_cache", bool, False),
        output_logits=_field(body, "output_logits", bool, False),
    )

    def run(job: Job):
        stream = model.generate_stream(
            tokens,
            attention_mask=mask,
            fwd_hooks=hooks,
            names_filter=names,
            max_tokens_per_yield=1,
            return_type="tokens",
            verbose=False,
            **kwargs,
        )
        step = 0
        try:
            while True:
                job.check()
                try:
                    chunk = next(stream)
                except StopIteration as done:
                    result = done.value
                    break
                job.emit({"step": step, "tokens": chunk[:, 0].tolist()})
                step += 1
        finally:
            stream.close()
        out: dict[str, torch.Tensor] = {}
        if kwargs["return_cache"] or kwargs["output_logits"]:
            out.update(sequences=result.sequences, attention_mask=result.attention_mask, finished=result.finished)
            if result.cache is not None:
                out.update({f"cache/{k}": v for k, v in result.cache.cache_dict.items()})
                if result.cache.tokens is not None:
                    out["cache_tokens"] = result.cache.tokens
                out["cache_attention_mask"] = result.cache.attention_mask
            if result.logits is not None:
                out["logits"] = torch.stack(list(result.logits), 1)  # [batch, new, d_vocab]
        else:
            out["sequences"] = result
        return {"cache": [k[6:] for k in out if k.startswith("cache/")]}, out

    return Job(user, "generate", run, tokens=tokens.numel() + tokens.shape[0] * n_new)


# -- patching sweeps ---------------------------------------------------------------------------
PATCH_FIELDS = {"op", "function", "metric", "setter", "activation", "axes", "batch_size", "chunk"}


def patch_job(model, user: str, body: dict, tensors: dict, limits: ServeLimits) -> Job:
    """A `hooked.analysis.patching` sweep: a named `get_act_patch_*` partial, or the generic sweep with a
    named setter; index rows (optional tensor `index`) and clean inputs come as tensors."""
    check_fields(body, PATCH_FIELDS)
    corrupted = check_tokens(model, tensors, "tokens", limits)
    clean = check_tokens(model, tensors, "clean_tokens", limits)
    clean_mask = check_mask(tensors, "clean_attention_mask", clean)
    if clean.shape[1] != corrupted.shape[1]:
        raise WireError("clean and corrupted tokens must have the same length", 422)
    metric = _metric(body, tensors)
    fn_name = _field(body, "function", str, None)
    if fn_name is not None:
        if fn_name not in PATCH_FUNCTIONS:
            raise WireError(f"unknown patching function {fn_name!r:.60}; known: {sorted(PATCH_FUNCTIONS)}", 422)
        fn = PATCH_FUNCTIONS[fn_name]
        activation, setter, axes = None, None, None
    else:
        setter = SETTERS.get(_field(body, "setter", str, required=True))
        activation = _field(body, "activation", str, required=True)
        if setter is None or activation not in ACTIVATION_NAMES:
            raise WireError(
                f"setter must be one of {sorted(SETTERS)}; activation one of {sorted(ACTIVATION_NAMES)}", 422
            )
        axes = body.get("axes")
        if axes is not None and (not isinstance(axes, list) or not set(axes) <= AXES or len(axes) > 4):
            raise WireError(f"axes must be a list of {sorted(AXES)}", 422)
    index = tensors.get("index")
    if index is not None and (index.dtype != torch.int64 or index.ndim != 2 or index.shape[0] > limits.max_patch_rows):
        raise WireError(f"index must be int64 [rows <= {limits.max_patch_rows}, axes]", 422)
    batch_size = _field(body, "batch_size", int, None, lo=1, hi=1024)
    chunk = _field(body, "chunk", int, 64, lo=1, hi=100_000)
    n_tokens = corrupted.numel() + clean.numel()

    def run(job: Job):
        with torch.inference_mode():
            if fn_name is not None:
                result = _sweep_named(model, fn, corrupted, clean, clean_mask, metric, batch_size, job)
            else:
                result = _sweep_generic(
                    model, setter, activation, axes, index, corrupted, clean, clean_mask, metric, batch_size, chunk, job
                )
        return {}, {"result": result}

    return Job(user, "patch", run, tokens=n_tokens)


def _clean_cache(model, clean, clean_mask, names):
    _, cache = model.run_with_cache(clean, attention_mask=clean_mask, names_filter=names)
    return cache


def _sweep_named(model, fn, corrupted, clean, clean_mask, metric, batch_size, job):
    cache = _clean_cache(model, clean, clean_mask, None)
    job.check()
    kwargs = {} if batch_size is None else {"batch_size": batch_size}
    result = fn(model, corrupted, cache, metric, verbose=False, **kwargs)
    job.emit({"progress": 1.0})
    return result


def _sweep_generic(
    model, setter, activation, axes, index, corrupted, clean, clean_mask, metric, batch_size, chunk, job
):
    """`generic_activation_patch` over chunks of index rows, reporting progress between chunks."""
    cache = _clean_cache(model, clean, clean_mask, lambda n: n.endswith(f"hook_{activation}"))
    if index is None:
        if axes is None:
            raise WireError("pass axes or an index tensor", 422)
        ranges = patching.axis_ranges(model, corrupted, activation)
        shape = [ranges[a] for a in axes]
        grids = torch.meshgrid(*[torch.arange(n) for n in shape], indexing="ij")
        rows = torch.stack([g.reshape(-1) for g in grids], dim=1)  # [prod(shape), n_axes]
    else:
        shape, rows = None, index
    values = []
    for start in range(0, rows.shape[0], chunk):
        job.check()
        part = rows[start : start + chunk]
        values.append(
            patching.generic_activation_patch(
                model, corrupted, cache, metric, setter, activation, index_df=part, batch_size=batch_size, verbose=False
            )
        )
        job.emit({"progress": min(1.0, (start + part.shape[0]) / rows.shape[0])})
    out = torch.cat(values) if values else torch.zeros(0)
    return out.reshape(shape) if shape is not None else out


# -- attribution patching ------------------------------------------------------------------------
ATTRIBUTION_FIELDS = {"op", "metric", "names", "method", "steps", "sum_batch", "recompute_softmax", "grad_drop"}


def attribution_job(model, user: str, body: dict, tensors: dict, limits: ServeLimits) -> Job:
    check_fields(body, ATTRIBUTION_FIELDS)
    clean = check_tokens(model, tensors, "clean_tokens", limits)
    corrupted = check_tokens(model, tensors, "tokens", limits)
    mask = check_mask(tensors, "attention_mask", corrupted)
    names = check_names(model, body.get("names"), "names", limits.max_cache_names)
    metric = _metric(body, tensors)
    method = _field(body, "method", str, "atp")
    if method not in ("atp", "ig"):
        raise WireError("method must be 'atp' or 'ig'", 422)
    kwargs: dict[str, Any] = dict(
        method=method,
        steps=_field(body, "steps", int, 32, lo=1, hi=256),
        sum_batch=_field(body, "sum_batch", bool, False),
        recompute_softmax=_field(body, "recompute_softmax", bool, False),
        grad_drop=_field(body, "grad_drop", bool, False),
    )

    def run(job: Job):
        from hooked.circuits.attribution import attribution_patch

        out = attribution_patch(model, clean, corrupted, metric, names, attention_mask=mask, **kwargs)
        return {"names": list(out)}, {f"attr/{k}": v for k, v in out.items()}

    return Job(
        user, "attribution", run, tokens=clean.numel() + corrupted.numel() * (kwargs["steps"] if method == "ig" else 2)
    )


OPS = {"forward": forward_job, "generate": generate_job, "patch": patch_job, "attribution": attribution_job}


def make_job(model, user: str, body: dict, tensors: dict, limits: ServeLimits) -> Job:
    op = body.get("op")
    if op not in OPS:
        raise WireError(f"unknown op {op!r:.40}; known: {sorted(OPS)}", 422)
    known = {
        k
        for k in tensors
        if k in ("tokens", "attention_mask", "clean_tokens", "clean_attention_mask", "index")
        or re.fullmatch(r"(h\d+(\.\d+)*|metric\.direction)", k)
    }
    if set(tensors) - known:
        raise WireError(f"unexpected tensor name(s) {sorted(set(tensors) - known)[:5]!r:.200}", 422)
    return OPS[op](model, user, body, tensors, limits)


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
