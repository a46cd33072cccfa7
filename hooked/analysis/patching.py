"""Activation patching (TransformerLens `patching` API), batched.

Activation patching runs the model on a corrupted prompt while copying one activation
from a clean run (one layer, position, head, ...), and records a metric of the patched
logits. Sweeping the index over layers, positions and heads locates the activations
that carry the clean behaviour.

`generic_activation_patch(..., batch_size=n)` evaluates n patches per forward: the
corrupted batch is repeated n times and each copy gets its own patch, so results equal
one forward per patch. The `get_act_patch_*` partials choose n from a memory budget.

A patch inside block l cannot change anything before block l, so the corrupted
residual stream entering each block is computed once, and each batched forward starts
at the first block its patches touch (patches are grouped by layer). This roughly
halves the work of a sweep over all layers.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Sequence
from functools import partial

import torch
from jaxtyping import Float, Int
from tqdm.auto import tqdm

from hooked.analysis.layer_types import check_present
from hooked.analysis.model_kinds import ModelKinds
from hooked.core.errors import PatchingError
from hooked.core.utils import get_act_name

logger = logging.getLogger(__name__)

#: model classes that run `generic_activation_patch` themselves (`hooked.remote`'s model: on its server); the
#: value takes the model and the sweep's arguments in order
COMPUTED_ELSEWHERE: ModelKinds[Callable[..., object]] = ModelKinds("runs generic_activation_patch itself")
#: model classes that cannot restart a forward at a middle layer from a recorded residual (`hooked.scale`'s
#: pipeline: False), so each patch runs the whole forward; unregistered models can (True)
RESUMES_AT_LAYER: ModelKinds[bool] = ModelKinds("can start a forward at a middle layer")

Activation = Float[torch.Tensor, "batch ..."]
PatchSetter = Callable[[torch.Tensor, Sequence[int], torch.Tensor], torch.Tensor]
Metric = Callable[[Float[torch.Tensor, "batch pos d_vocab"]], Float[torch.Tensor, ""]]

#: Activation memory the automatic batch size may use for one batched forward.
DEFAULT_PATCH_MEMORY_BYTES = 2 * 2**30
#: Most patches evaluated by one forward when the batch size is automatic.
MAX_AUTO_BATCH = 64
_KV_NAMES = ("k", "v", "rot_k")


# -- patch setters: write clean into corrupted at the index ---------------------------------
def layer_pos_patch_setter(
    corrupted_activation: Activation, index: Sequence[int], clean_activation: Activation
) -> Activation:
    """`[:, pos, ...]` of a `[batch, pos, ...]` activation."""
    layer, pos = index
    corrupted_activation[:, pos, ...] = clean_activation[:, pos, ...]
    return corrupted_activation


def layer_pos_head_vector_patch_setter(
    corrupted_activation: Activation, index: Sequence[int], clean_activation: Activation
) -> Activation:
    """`[:, pos, head]` of a `[batch, pos, head, d_head]` activation."""
    layer, pos, head_index = index
    corrupted_activation[:, pos, head_index] = clean_activation[:, pos, head_index]
    return corrupted_activation


def layer_head_vector_patch_setter(
    corrupted_activation: Activation, index: Sequence[int], clean_activation: Activation
) -> Activation:
    """`[:, :, head]` of a `[batch, pos, head, d_head]` activation (every position)."""
    layer, head_index = index
    corrupted_activation[:, :, head_index] = clean_activation[:, :, head_index]
    return corrupted_activation


def layer_head_pattern_patch_setter(
    corrupted_activation: Activation, index: Sequence[int], clean_activation: Activation
) -> Activation:
    """`[:, head, :, :]` of a `[batch, head, dest, src]` pattern."""
    layer, head_index = index
    corrupted_activation[:, head_index, :, :] = clean_activation[:, head_index, :, :]
    return corrupted_activation


def layer_head_pos_pattern_patch_setter(
    corrupted_activation: Activation, index: Sequence[int], clean_activation: Activation
) -> Activation:
    """`[:, head, dest, :]` of a `[batch, head, dest, src]` pattern."""
    layer, head_index, dest_pos = index
    corrupted_activation[:, head_index, dest_pos, :] = clean_activation[:, head_index, dest_pos, :]
    return corrupted_activation


def layer_head_dest_src_pos_pattern_patch_setter(
    corrupted_activation: Activation, index: Sequence[int], clean_activation: Activation
) -> Activation:
    """`[:, head, dest, src]` of a `[batch, head, dest, src]` pattern."""
    layer, head_index, dest_pos, src_pos = index
    corrupted_activation[:, head_index, dest_pos, src_pos] = clean_activation[:, head_index, dest_pos, src_pos]
    return corrupted_activation


# -- index tuples ----------------------------------------------------------------------------
def axis_ranges(model, corrupted_tokens: Int[torch.Tensor, "batch pos"], activation_name: str) -> dict[str, int]:
    """The length of each index axis; heads of k/v count key/value heads under GQA."""
    cfg = model.cfg
    n_pos = corrupted_tokens.shape[-1]
    grouped = cfg.uses_grouped_query_attention and not cfg.ungroup_grouped_query_attention
    n_heads = cfg.n_kv_heads if grouped and activation_name in _KV_NAMES else cfg.n_heads
    return dict(layer=cfg.n_layers, pos=n_pos, src_pos=n_pos, dest_pos=n_pos, head=n_heads, head_index=n_heads)


def _index_rows(index_df) -> list[tuple[int, ...]]:
    """Rows of a pandas DataFrame, a `[n, k]` tensor/array or a list of tuples, as int tuples."""
    if hasattr(index_df, "itertuples"):
        return [tuple(int(v) for v in row) for row in index_df.itertuples(index=False)]
    table = torch.as_tensor(index_df).reshape(len(index_df), -1)  # [n_rows, n_axes]
    return [tuple(int(v) for v in row) for row in table.tolist()]


def _make_index_df(rows: list[tuple[int, ...]], names: Sequence[str]):
    try:
        import pandas as pd
    except ImportError:  # pandas is optional: fall back to a [n, k] tensor
        return torch.tensor(rows, dtype=torch.long).reshape(len(rows), len(names))
    return pd.DataFrame(rows, columns=list(names))


def auto_batch_size(model, corrupted_tokens: torch.Tensor, n_patches: int, memory_bytes: int | None = None) -> int:
    """Patches per forward that keep one batched forward's activations under `memory_bytes`.

    The estimate counts the residual-sized tensors, MLP hiddens, attention patterns and
    logits that a forward keeps alive per row of the corrupted batch.
    """
    cfg = model.cfg
    batch, n_pos = corrupted_tokens.shape[0], corrupted_tokens.shape[-1]
    per_pos = 8 * cfg.d_model + 2 * (cfg.d_mlp or 0) + 2 * cfg.n_heads * n_pos
    floats = batch * n_pos * (cfg.n_layers * per_pos + 2 * cfg.d_vocab_out)
    bytes_per_patch = floats * torch.tensor([], dtype=cfg.dtype).element_size()
    budget = DEFAULT_PATCH_MEMORY_BYTES if memory_bytes is None else memory_bytes
    return max(1, min(n_patches, MAX_AUTO_BATCH, budget // max(1, bytes_per_patch)))


# -- the generic sweep -----------------------------------------------------------------------
def generic_activation_patch(
    model,
    corrupted_tokens: Int[torch.Tensor, "batch pos"],
    clean_cache,
    patching_metric: Metric,
    patch_setter: PatchSetter,
    activation_name: str,
    index_axis_names: Sequence[str] | None = None,
    index_df=None,
    return_index_df: bool = False,
    *,
    batch_size: int | None = 1,
    verbose: bool = True,
):
    """Patch clean activations into the corrupted run at every index and record the metric.

    Index tuples are every combination over `index_axis_names` (output shaped by the
    axis lengths) or the rows of `index_df` (flat output); the first entry is the layer.
    `batch_size` patches run per forward (None: `auto_batch_size`), with the same results
    as one forward each. A tqdm bar counts the patches (`verbose=False` hides it).
    A `hooked.remote` model runs the sweep on its server (`patching_metric` then must be
    a `hooked.analysis.metrics` object).

    Args:
        model: the `HookedTransformer`.
        corrupted_tokens: the corrupted prompt(s) `[batch, pos]`, run once per patch.
        clean_cache: the `ActivationCache` of the clean run, same shape as the corrupted run.
        patching_metric: logits `[batch, pos, d_vocab]` -> scalar (one number per patch).
        patch_setter: `(corrupted_activation, index, clean_activation) -> patched activation`,
            e.g. `layer_pos_patch_setter`.
        activation_name: the activation patched in each layer (`"resid_pre"`, `"z"`, `"pattern"`, ...).
        index_axis_names: the axes to sweep, e.g. `["layer", "pos"]` or `["layer", "pos", "head"]`.
        index_df: explicit index rows instead: a pandas DataFrame, a list of tuples or an
            `[n, k]` tensor (first column the layer).
        return_index_df: also return the index as a DataFrame (needs pandas).
        batch_size: patches per forward (1: one forward each; None: as many as fit a memory budget).
        verbose: show the progress bar.

    Returns:
        The metric per patch: `[*axis lengths]` (e.g. `[layer, pos]`), or `[n]` for `index_df`.
    """
    elsewhere = COMPUTED_ELSEWHERE.lookup(model)
    if elsewhere is not None:  # e.g. a served model: its server runs the sweep
        return elsewhere(
            model,
            corrupted_tokens,
            clean_cache,
            patching_metric,
            patch_setter,
            activation_name,
            index_axis_names,
            index_df,
            return_index_df,
            batch_size,
            verbose,
        )
    _check_clean_matches(model, corrupted_tokens, clean_cache, activation_name)
    if index_df is None:
        if index_axis_names is None:
            raise ValueError("Pass index_axis_names or index_df")
        ranges = axis_ranges(model, corrupted_tokens, activation_name)
        shape = [ranges[name] for name in index_axis_names]
        rows = list(itertools.product(*(range(n) for n in shape)))
        index_df = _make_index_df(rows, index_axis_names) if return_index_df else None
    else:
        shape, rows = None, _index_rows(index_df)
    if batch_size is None:
        batch_size = auto_batch_size(model, corrupted_tokens, len(rows))
    tokens = corrupted_tokens if corrupted_tokens.ndim == 2 else corrupted_tokens[None]  # [batch, pos]
    order = sorted(range(len(rows)), key=lambda i: rows[i][0])  # stable: group patches by layer
    prefix = _CorruptedPrefix(model, tokens, activation_name, [rows[i] for i in order[::batch_size]])
    values = [0.0] * len(rows)
    with tqdm(total=len(rows), desc=f"patching {activation_name}", unit="patch", disable=not verbose) as bar:
        for start in range(0, len(rows), batch_size):
            chunk = order[start : start + batch_size]
            metrics = _patched_metrics(
                model,
                tokens,
                clean_cache,
                patching_metric,
                patch_setter,
                activation_name,
                [rows[i] for i in chunk],
                prefix,
            )
            for i, value in zip(chunk, metrics, strict=True):
                values[i] = value
            bar.update(len(chunk))
    out = torch.tensor(values, device=model.cfg.device)
    out = out.reshape(shape) if shape is not None else out  # [*axis lengths] or [n_rows]
    return (out, index_df) if return_index_df else out


class _CorruptedPrefix:
    """The corrupted residual stream entering the blocks where batched forwards start.

    A patch at `blocks.{l}.…` leaves blocks 0..l-1 as in the corrupted run, so a chunk
    whose first patch is at layer l > 0 starts at block l from this cached residual.
    It is recorded before any hook already on `blocks.{l}.hook_resid_pre`, which
    therefore still runs once, in the patched forward. Hooks on earlier hook points run
    once here instead of once per chunk. Not used for shortformer models (their
    position embedding enters every block) or for hook points outside the blocks.
    """

    def __init__(self, model, tokens: Int[torch.Tensor, "batch pos"], activation_name: str, first_rows):
        self.resid: dict[int, torch.Tensor] = {}  # layer -> [batch, pos, d_model]
        self.attention_mask = None
        layers = sorted({index[0] for index in first_rows if index[0] > 0})
        layers = [
            layer_i
            for layer_i in layers
            if get_act_name(activation_name, layer=layer_i).startswith(f"blocks.{layer_i}.")
        ]
        resumes = RESUMES_AT_LAYER.lookup(model) is not False
        if not layers or model.cfg.positional_embedding_type == "shortformer" or not resumes:
            return

        def record(act: torch.Tensor, hook) -> None:
            self.resid[hook.layer()] = act.detach().clone()

        with torch.no_grad(), model.hooks() as m:
            for layer in layers:
                m.add_hook(f"blocks.{layer}.hook_resid_pre", record, level=m.context_level, prepend=True)
            m(tokens, stop_at_layer=layers[-1] + 1)
            state = m.forward_state
            self.attention_mask = None if state is None else state.attention_mask

    def start(self, layer: int) -> int:
        """The block a chunk whose lowest patched layer is `layer` starts at (0: from the tokens)."""
        return layer if layer in self.resid else 0


def _patched_metrics(
    model, tokens, clean_cache, metric, patch_setter, activation_name, chunk, prefix: _CorruptedPrefix | None = None
) -> list[float]:
    """One forward over `len(chunk)` copies of the corrupted batch, copy i patched at `chunk[i]`."""
    tokens = tokens if tokens.ndim == 2 else tokens[None]  # [batch, pos]
    batch, copies = tokens.shape[0], len(chunk)
    by_hook: dict[str, list[tuple[int, tuple[int, ...]]]] = {}
    for copy, index in enumerate(chunk):
        by_hook.setdefault(get_act_name(activation_name, layer=index[0]), []).append((copy, index))
    hooks = [
        (name, partial(_patch_copies, patches=patches, batch=batch, clean=clean_cache[name], setter=patch_setter))
        for name, patches in by_hook.items()
    ]
    replicated = tokens.repeat(copies, 1)  # [copies * batch, pos]
    start = prefix.start(min(index[0] for index in chunk)) if prefix is not None else 0
    with torch.no_grad():  # metrics are read as floats: no graph over the replicated batch
        if start == 0 or prefix is None:  # (a prefix is what makes start > 0)
            logits = model.run_with_hooks(replicated, fwd_hooks=hooks)  # [copies * batch, pos, d_vocab]
        else:
            mask = prefix.attention_mask
            logits = model.run_with_hooks(
                prefix.resid[start].repeat(copies, 1, 1),  # [copies * batch, pos, d_model]
                start_at_layer=start,
                tokens=replicated,
                attention_mask=None if mask is None else mask.repeat(copies, 1),
                fwd_hooks=hooks,
            )
        return [_scalar(metric(logits[i * batch : (i + 1) * batch]), metric) for i in range(copies)]


def _scalar(value, metric=None) -> float:
    """The metric's value as a float; anything but a one-element tensor or a number raises."""
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return value.item()
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    what = f"a tensor of shape {tuple(value.shape)}" if isinstance(value, torch.Tensor) else repr(value)
    raise PatchingError(
        f"patching_metric {getattr(metric, '__name__', metric)!r} must return a scalar (a number or a one-element "
        f"tensor) per patched run, got {what}; reduce it, e.g. with .mean()"
    )


def _check_clean_matches(model, corrupted_tokens, clean_cache, activation_name: str) -> None:
    """The clean cache must come from inputs of the corrupted tokens' length and batch size."""
    if not isinstance(corrupted_tokens, torch.Tensor) or corrupted_tokens.is_floating_point():
        raise PatchingError(
            f"corrupted_tokens must be integer token ids [batch, pos], got {type(corrupted_tokens).__name__}"
        )
    tokens = corrupted_tokens if corrupted_tokens.ndim == 2 else corrupted_tokens[None]  # [batch, pos]
    name = get_act_name(activation_name, layer=0)
    # a hybrid: every swept layer must have the activation (`attn_out` exists on attention layers only)
    check_present(model.cfg, [get_act_name(activation_name, layer=layer) for layer in range(model.cfg.n_layers)])
    if name not in clean_cache:
        raise PatchingError(f"clean_cache has no {name!r}: cache it with run_with_cache (names_filter including it)")
    hook = model.hook_dict.get(name)
    clean = clean_cache[name]
    axis = getattr(hook, "pos_axis", 1)
    if axis is not None and clean.ndim > axis and clean.shape[axis] != tokens.shape[1]:
        raise PatchingError(
            f"the clean run has {clean.shape[axis]} positions ({name} shape {tuple(clean.shape)}) but corrupted_tokens "
            f"has {tokens.shape[1]}: clean and corrupted prompts must have the same number of tokens"
        )
    if clean.shape[0] not in (1, tokens.shape[0]):
        raise PatchingError(
            f"the clean run has batch size {clean.shape[0]} ({name}) but corrupted_tokens has {tokens.shape[0]}"
        )


def _patch_copies(act: torch.Tensor, hook, patches, batch: int, clean: torch.Tensor, setter: PatchSetter):
    if act.requires_grad:
        act = act.clone()
    clean = clean.to(act.device)
    for copy, index in patches:
        rows = slice(copy * batch, (copy + 1) * batch)
        view = act[rows]  # a view: in-place setters write straight into act
        patched = setter(view, list(index), clean)
        if patched is not view:
            act[rows] = patched
    return act


# -- partials (TransformerLens names) --------------------------------------------------------
def _partial(setter: PatchSetter, name: str, axes: tuple[str, ...]):
    fn = partial(
        generic_activation_patch, patch_setter=setter, activation_name=name, index_axis_names=axes, batch_size=None
    )
    fn.__doc__ = (
        f"Patch `{name}` at every ({', '.join(axes)}) and return the metric, `[{', '.join(axes)}]`.\n\n"
        f"`fn(model, corrupted_tokens, clean_cache, patching_metric, *, batch_size=None, verbose=True)`:\n"
        f"`generic_activation_patch` with the setter `{setter.__name__}`, many patches per forward."
    )
    return fn


get_act_patch_resid_pre = _partial(layer_pos_patch_setter, "resid_pre", ("layer", "pos"))
get_act_patch_resid_mid = _partial(layer_pos_patch_setter, "resid_mid", ("layer", "pos"))
get_act_patch_attn_out = _partial(layer_pos_patch_setter, "attn_out", ("layer", "pos"))
get_act_patch_mlp_out = _partial(layer_pos_patch_setter, "mlp_out", ("layer", "pos"))
get_act_patch_attn_head_out_by_pos = _partial(layer_pos_head_vector_patch_setter, "z", ("layer", "pos", "head"))
get_act_patch_attn_head_q_by_pos = _partial(layer_pos_head_vector_patch_setter, "q", ("layer", "pos", "head"))
get_act_patch_attn_head_k_by_pos = _partial(layer_pos_head_vector_patch_setter, "k", ("layer", "pos", "head"))
get_act_patch_attn_head_v_by_pos = _partial(layer_pos_head_vector_patch_setter, "v", ("layer", "pos", "head"))
get_act_patch_attn_head_pattern_by_pos = _partial(
    layer_head_pos_pattern_patch_setter, "pattern", ("layer", "head_index", "dest_pos")
)
get_act_patch_attn_head_pattern_dest_src_pos = _partial(
    layer_head_dest_src_pos_pattern_patch_setter, "pattern", ("layer", "head_index", "dest_pos", "src_pos")
)
get_act_patch_attn_head_out_all_pos = _partial(layer_head_vector_patch_setter, "z", ("layer", "head"))
get_act_patch_attn_head_q_all_pos = _partial(layer_head_vector_patch_setter, "q", ("layer", "head"))
get_act_patch_attn_head_k_all_pos = _partial(layer_head_vector_patch_setter, "k", ("layer", "head"))
get_act_patch_attn_head_v_all_pos = _partial(layer_head_vector_patch_setter, "v", ("layer", "head"))
get_act_patch_attn_head_pattern_all_pos = _partial(layer_head_pattern_patch_setter, "pattern", ("layer", "head_index"))


def _metric_values(result: object) -> torch.Tensor:
    """The metric tensor of one `get_act_patch_*` call inside a `*_every` function."""
    if not isinstance(result, torch.Tensor):
        raise PatchingError("the get_act_patch_*_every functions stack plain results: do not pass return_index_df=True")
    return result


def _pad_heads(x: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Zero-pad the last (head) axis up to `n_heads` (GQA k/v have fewer heads)."""
    return torch.nn.functional.pad(x, (0, n_heads - x.shape[-1]))


def get_act_patch_attn_head_all_pos_every(
    model, corrupted_tokens, clean_cache, metric, **kwargs
) -> Float[torch.Tensor, "5 layer head"]:
    """Head out (z), q, k, v and pattern patched over all positions: `[5, L, H]`."""
    H = model.cfg.n_heads
    parts = [
        fn(model, corrupted_tokens, clean_cache, metric, **kwargs)
        for fn in (
            get_act_patch_attn_head_out_all_pos,
            get_act_patch_attn_head_q_all_pos,
            get_act_patch_attn_head_k_all_pos,
            get_act_patch_attn_head_v_all_pos,
            get_act_patch_attn_head_pattern_all_pos,
        )
    ]
    return torch.stack([_pad_heads(_metric_values(p), H) for p in parts], dim=0)


def get_act_patch_attn_head_by_pos_every(
    model, corrupted_tokens, clean_cache, metric, **kwargs
) -> Float[torch.Tensor, "5 layer pos head"]:
    """Head out (z), q, k, v and pattern patched per position: `[5, L, pos, H]`."""
    H = model.cfg.n_heads
    parts = [
        fn(model, corrupted_tokens, clean_cache, metric, **kwargs)
        for fn in (
            get_act_patch_attn_head_out_by_pos,
            get_act_patch_attn_head_q_by_pos,
            get_act_patch_attn_head_k_by_pos,
            get_act_patch_attn_head_v_by_pos,
        )
    ]
    pattern = get_act_patch_attn_head_pattern_by_pos(model, corrupted_tokens, clean_cache, metric, **kwargs)
    parts.append(_metric_values(pattern).transpose(1, 2))  # [L, H, dest_pos] -> [L, dest_pos, H]
    return torch.stack([_pad_heads(_metric_values(p), H) for p in parts], dim=0)


def get_act_patch_block_every(
    model, corrupted_tokens, clean_cache, metric, **kwargs
) -> Float[torch.Tensor, "3 layer pos"]:
    """resid_pre, attn_out and mlp_out patched per position: `[3, L, pos]`."""
    fns = (get_act_patch_resid_pre, get_act_patch_attn_out, get_act_patch_mlp_out)
    return torch.stack(
        [_metric_values(fn(model, corrupted_tokens, clean_cache, metric, **kwargs)) for fn in fns], dim=0
    )
