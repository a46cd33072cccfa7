"""Argument checks at the public API boundary, run once per call before any work.

Each check either returns a normalised value or raises an error from `hooked.core.errors`
whose message names the argument, the offending value and the fix. The checks are
cheap: shape and dtype tests, and at most one reduction (`aminmax`) over the token ids
or the mask, so they do not slow the forward pass measurably.
"""

from __future__ import annotations

import difflib
import math
import numbers
from typing import Any, TypeVar

import numpy as np
import torch

from hooked.core.errors import (
    AttentionMaskError,
    ConfigError,
    InputError,
    InputTypeError,
    KVCacheMismatchError,
    TokenError,
)

_T = TypeVar("_T")


def require_set(value: _T | None, name: str) -> _T:
    """`value`, the config field `name` that a component needs; `ConfigError` if it is None."""
    if value is None:
        raise ConfigError(f"this component needs cfg.{name}, which is None: set it in the config")
    return value


# -- dtypes --------------------------------------------------------------------------------------
DTYPES = {
    "float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
    "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float64": torch.float64, "fp64": torch.float64, "double": torch.float64,
}  # fmt: skip


def to_dtype(dtype: Any, name: str = "dtype") -> torch.dtype:
    """A floating `torch.dtype` from a dtype or its name ("float32", "torch.bfloat16", "fp16", ...)."""
    if isinstance(dtype, torch.dtype):
        if not dtype.is_floating_point:
            raise InputError(f"{name}={dtype} is not a floating dtype; use one of float32, float16, bfloat16, float64")
        return dtype
    if isinstance(dtype, str) and dtype.removeprefix("torch.") in DTYPES:
        return DTYPES[dtype.removeprefix("torch.")]
    close = difflib.get_close_matches(str(dtype).removeprefix("torch."), list(DTYPES), n=3, cutoff=0.5)
    hint = f" Did you mean {', '.join(close)}?" if close else ""
    raise InputError(f"{name}={dtype!r} is not a dtype hooked can load into.{hint} Choose one of {', '.join(DTYPES)}.")


# -- model input -------------------------------------------------------------------------------
def check_text(input: str | list, name: str = "input") -> list[str]:
    """A str or a non-empty list of str, as a list."""
    if isinstance(input, str):
        return [input]
    if not isinstance(input, (list, tuple)):
        raise InputTypeError(f"{name} must be a str or a list of str, got {type(input).__name__} ({input!r})")
    if len(input) == 0:
        raise InputError(f"{name} is an empty list of prompts: pass at least one string")
    bad = [i for i, s in enumerate(input) if not isinstance(s, str)]
    if bad:
        raise InputTypeError(
            f"{name} is a list, so every item must be a str; item {bad[0]} is {type(input[bad[0]]).__name__} "
            f"({input[bad[0]]!r}). Pass token ids as an integer tensor of shape [batch, pos]."
        )
    return list(input)


def check_model_input(input: Any, d_model: int, name: str = "input") -> None:
    """Raise unless `input` is text, integer tokens `[pos]`/`[batch, pos]` or float embeddings
    `[batch, pos, d_model]`."""
    if isinstance(input, (str, list)):
        return
    if not isinstance(input, torch.Tensor):
        raise InputTypeError(
            f"{name} must be a str, a list of str, integer token ids [batch, pos] or float embeddings "
            f"[batch, pos, d_model]; got {type(input).__name__}"
        )
    if input.is_floating_point():
        if input.ndim != 3 or input.shape[-1] != d_model:
            raise TokenError(
                f"a float {name} is read as token embeddings [batch, pos, d_model={d_model}], but it has shape "
                f"{tuple(input.shape)}. For token ids pass an integer tensor (e.g. {name}.long())."
            )
        if input.shape[1] == 0:
            raise TokenError(f"{name} has no positions (shape {tuple(input.shape)})")
        return
    check_token_shape(input, name)


def check_token_shape(tokens: torch.Tensor, name: str = "tokens") -> None:
    """Integer (not bool) ids of rank 1 or 2 with at least one position."""
    if tokens.dtype == torch.bool or tokens.is_complex() or tokens.is_floating_point():
        raise TokenError(f"{name} must be integer token ids, got dtype {tokens.dtype}")
    if tokens.ndim not in (1, 2):
        raise TokenError(f"{name} must be token ids of shape [pos] or [batch, pos], got shape {tuple(tokens.shape)}")
    if tokens.numel() == 0:
        raise TokenError(f"{name} is empty (shape {tuple(tokens.shape)}): a forward needs at least one token per row")


def check_token_range(tokens: torch.Tensor, d_vocab: int, name: str = "tokens") -> None:
    """Every id in `[0, d_vocab)`; one `aminmax` over the ids (a device-side assertion under `torch.compile`)."""
    if torch.compiler.is_compiling():
        in_range = (tokens >= 0).all() & (tokens < d_vocab).all()
        torch._assert_async(  # pyright: ignore[reportPrivateImportUsage] - not in torch.__all__
            in_range, f"{name} contains a token id outside the vocabulary [0, {d_vocab}) of this model"
        )
        return
    lo, hi = (int(v) for v in torch.aminmax(tokens))
    if lo < 0 or hi >= d_vocab:
        bad = lo if lo < 0 else hi
        raise TokenError(f"{name} contains token id {bad}, outside the vocabulary [0, {d_vocab}) of this model")


def check_no_text_for_residual(input: Any, start_at_layer: int, d_model: int | None = None) -> None:
    """With `start_at_layer`, the input is the residual stream `[batch, pos, d_model]`."""
    bad_width = d_model is not None and isinstance(input, torch.Tensor) and input.shape[-1:] != (d_model,)
    if not isinstance(input, torch.Tensor) or not input.is_floating_point() or input.ndim != 3 or bad_width:
        what = type(input).__name__ if not isinstance(input, torch.Tensor) else f"{input.dtype} {tuple(input.shape)}"
        raise InputError(
            f"start_at_layer={start_at_layer} takes the residual stream [batch, pos, d_model={d_model}] "
            "entering that block "
            f"as input, got {what}. Run model(tokens, stop_at_layer={start_at_layer}) to get it, and pass the "
            "token ids as tokens= if a loss is wanted."
        )


def check_residual_input(residual: Any, start_at_layer: int, tokens: Any, d_model: int | None) -> None:
    """A forward from `start_at_layer`: a residual `[batch, pos, d_model]`, and token ids (for the loss) if any."""
    check_no_text_for_residual(residual, start_at_layer, d_model)
    if tokens is not None:
        check_token_shape(tokens, "tokens")


def check_layer(layer: Any, name: str, low: int, high: int) -> None:
    """An int in `[low, high]` (e.g. `start_at_layer` in `[-n_layers, n_layers]`)."""
    if not _is_int(layer):
        raise InputTypeError(f"{name} must be an int or None, got {type(layer).__name__} ({layer!r})")
    if not low <= layer <= high:
        raise InputError(f"{name}={layer} is out of range: this model's layers allow {low} to {high}")


# -- attention mask ------------------------------------------------------------------------------
def mask_dtype_check(mask: Any) -> torch.Tensor:
    """A tensor mask of integer or bool dtype and rank 2 (values are checked with `mask_is_all_ones`)."""
    if not isinstance(mask, torch.Tensor):
        raise AttentionMaskError(f"attention_mask must be a tensor of 0/1, got {type(mask).__name__}")
    if mask.is_floating_point() or mask.is_complex():
        raise AttentionMaskError(
            f"attention_mask must hold integers 0/1 or bools, got dtype {mask.dtype}: a float mask would be "
            "truncated, not used as weights. Convert a 0/1 float mask with attention_mask.long()."
        )
    if mask.ndim != 2:
        raise AttentionMaskError(f"attention_mask must have shape [batch, pos], got shape {tuple(mask.shape)}")
    return mask


def mask_is_all_ones(mask: torch.Tensor) -> bool:
    """Whether a `[batch, pos]` long mask is all ones; raises if any value is not 0 or 1 (one reduction)."""
    if mask.numel() == 0:
        return True
    if torch.compiler.is_compiling():  # no value-dependent branch in a graph: a padded mask is right for all
        torch._assert_async(  # pyright: ignore[reportPrivateImportUsage] - not in torch.__all__
            ((mask == 0) | (mask == 1)).all(), "attention_mask must hold only 0 and 1"
        )
        return False
    lo, hi = (int(v) for v in torch.aminmax(mask))
    if lo < 0 or hi > 1:
        raise AttentionMaskError(f"attention_mask must hold only 0 and 1, but contains {lo if lo < 0 else hi}")
    return lo == 1


# -- hooks ---------------------------------------------------------------------------------------
def check_hook_fn(hook: Any, where: str) -> None:
    if not callable(hook):
        raise InputTypeError(f"the hook for {where} must be callable as fn(tensor, *, hook), got {hook!r}")


def check_hook_pairs(pairs: Any, name: str = "fwd_hooks") -> list[tuple[Any, Any]]:
    """A list of `(hook name or filter, fn)` pairs, validated before any hook is added."""
    if isinstance(pairs, tuple) and len(pairs) == 2 and isinstance(pairs[0], str) and callable(pairs[1]):
        raise InputTypeError(
            f"{name} must be a list of (name, fn) pairs, got one bare pair: wrap it as {name}=[({pairs[0]!r}, fn)]"
        )
    if isinstance(pairs, (str, bytes)) or not _iterable(pairs):
        raise InputTypeError(f"{name} must be a list of (name or filter, fn) pairs, got {type(pairs).__name__}")
    out = []
    for i, pair in enumerate(pairs):
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise InputTypeError(f"{name}[{i}] must be a (name or filter, fn) pair, got {pair!r}")
        hook_name, fn = pair
        if not isinstance(hook_name, str) and not callable(hook_name):
            raise InputTypeError(
                f"{name}[{i}][0] must be a hook name (str) or a Callable[[str], bool] filter, got {hook_name!r}"
            )
        check_hook_fn(fn, f"{name}[{i}] ({hook_name if isinstance(hook_name, str) else 'a filter'})")
        out.append((hook_name, fn))
    return out


def check_names_filter(names_filter: Any, name: str = "names_filter") -> Any:
    """None, a str, a Callable[[str], bool], or an iterable of str (returned as a list, so a generator is read once)."""
    if names_filter is None or isinstance(names_filter, str) or callable(names_filter):
        return names_filter
    if not _iterable(names_filter):
        raise InputTypeError(
            f"{name} must be None, a hook name, a list of hook names or a Callable[[str], bool], "
            f"got {type(names_filter).__name__} ({names_filter!r})"
        )
    names = list(names_filter)
    bad = [n for n in names if not isinstance(n, str)]
    if bad:
        raise InputTypeError(f"{name} must list hook names as str, got {bad[0]!r}")
    return names


def check_pos_slice(pos_slice: Any, name: str = "pos_slice") -> None:
    """None, an int, a (start, stop[, step]) tuple of ints, a slice, or int indices (list, array, tensor)."""
    if pos_slice is None or isinstance(pos_slice, slice):
        return
    if isinstance(pos_slice, (bool, float, str, bytes)):
        raise InputTypeError(f"{name} must be None, an int, a tuple, a slice or a list of ints, got {pos_slice!r}")
    if isinstance(pos_slice, numbers.Integral):
        return
    if isinstance(pos_slice, tuple):
        if not 1 <= len(pos_slice) <= 3 or any(v is not None and not _is_int(v) for v in pos_slice):
            raise InputTypeError(
                f"{name} as a tuple means slice(start, stop[, step]) of ints or None, got {pos_slice!r}"
            )
        return
    if isinstance(pos_slice, (list, np.ndarray, torch.Tensor)):
        array = np.asarray(pos_slice.cpu() if isinstance(pos_slice, torch.Tensor) else pos_slice)
        if array.size and not np.issubdtype(array.dtype, np.integer):
            raise InputTypeError(f"{name} indices must be ints, got dtype {array.dtype} ({pos_slice!r})")
        return
    raise InputTypeError(
        f"{name} must be None, an int, a tuple, a slice or a list of ints, got {type(pos_slice).__name__}"
    )


# -- generate --------------------------------------------------------------------------------------
def check_generate_args(
    max_new_tokens, temperature, top_k, top_p, freq_penalty, repetition_penalty, seed, eos_token_id, d_vocab
) -> None:
    """Types and ranges of `generate`'s numeric arguments (`d_vocab=None`: eos ids are not range-checked)."""
    _int_at_least(max_new_tokens, "max_new_tokens", 0)
    if top_k is not None:
        _int_at_least(top_k, "top_k", 1)
    if top_p is not None and not (_is_number(top_p) and 0.0 < top_p <= 1.0):
        raise InputError(f"top_p must be a number in (0, 1], got {top_p!r}")
    if not (_is_number(temperature) and math.isfinite(temperature) and temperature >= 0):
        raise InputError(f"temperature must be a finite number >= 0 (0 = greedy), got {temperature!r}")
    if not (_is_number(freq_penalty) and math.isfinite(freq_penalty)):
        raise InputError(f"freq_penalty must be a finite number, got {freq_penalty!r}")
    if not (_is_number(repetition_penalty) and math.isfinite(repetition_penalty) and repetition_penalty > 0):
        raise InputError(f"repetition_penalty must be a finite number > 0, got {repetition_penalty!r}")
    if seed is not None and not _is_int(seed):
        raise InputTypeError(f"seed must be an int, got {type(seed).__name__} ({seed!r})")
    if eos_token_id is not None:
        _check_eos_token_id(eos_token_id, d_vocab)


def _check_eos_token_id(eos_token_id: Any, d_vocab: int | None) -> None:
    """An int or a non-empty list of ints, each in the vocabulary (`d_vocab=None`: not range-checked)."""
    ids = [eos_token_id] if _is_int(eos_token_id) else eos_token_id
    if not _iterable(ids) or isinstance(ids, str) or not all(_is_int(i) for i in ids):
        raise InputTypeError(f"eos_token_id must be an int or a list of ints, got {eos_token_id!r}")
    ids = list(ids)
    if not ids:
        raise InputError("eos_token_id is an empty list: pass None to use the tokenizer's EOS")
    bad = [] if d_vocab is None else [i for i in ids if not 0 <= i < d_vocab]
    if bad:
        raise InputError(f"eos_token_id {bad[0]} is outside the vocabulary [0, {d_vocab})")


# -- small predicates ------------------------------------------------------------------------------
def _is_int(v: Any) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


def _int_at_least(v: Any, name: str, low: int) -> None:
    if not _is_int(v):
        raise InputTypeError(f"{name} must be an int, got {type(v).__name__} ({v!r})")
    if v < low:
        raise InputError(f"{name} must be >= {low}, got {v}")


def _iterable(v: Any) -> bool:
    try:
        iter(v)
    except TypeError:
        return False
    return True


# -- KV cache ----------------------------------------------------------------------------------------
def check_kv_cache(cache: Any, cfg: Any, batch: int) -> None:
    """A `HookedTransformerKeyValueCache` built for this model (layers, heads, d_head) and this batch size."""
    if not hasattr(cache, "entries") or not hasattr(cache, "previous_attention_mask"):
        raise InputTypeError(f"past_kv_cache must be a HookedTransformerKeyValueCache, got {type(cache).__name__}")
    if len(cache.entries) != cfg.n_layers:
        raise KVCacheMismatchError(
            f"past_kv_cache has {len(cache.entries)} layers but the model has {cfg.n_layers}: "
            "build it with HookedTransformerKeyValueCache.init_cache(model.cfg, batch_size=...)"
        )
    cached_batch = cache.previous_attention_mask.shape[0]
    if cached_batch != batch:
        raise KVCacheMismatchError(
            f"past_kv_cache was built for batch size {cached_batch}, but this input has batch size {batch}: "
            "use one cache per batch (init_cache(model.cfg, batch_size=...))"
        )
    kv_layers = [layer for layer, entry in enumerate(cache.entries) if hasattr(entry, "past_keys")]
    if len(kv_layers) != len(cfg.attention_layers):  # a hybrid's recurrent layers hold states, not keys
        raise KVCacheMismatchError(
            f"past_kv_cache has {len(kv_layers)} key/value layers but the model has {len(cfg.attention_layers)} "
            "attention layers: build it with HookedTransformerKeyValueCache.init_cache(model.cfg, batch_size=...)"
        )
    if not kv_layers:
        return
    first = kv_layers[0]  # its shape says which model the cache was built for (shapes may vary by layer)
    heads, d_key, _ = cfg.kv_cache_entry_shape(first)
    shape = tuple(cache.entries[first].past_keys.shape[2:])
    if shape != (heads, d_key):
        raise KVCacheMismatchError(
            f"past_kv_cache stores keys with [kv_head, d_head] = {list(shape)}, but this model needs "
            f"{[heads, d_key]}: the cache was built for another model or GQA setting"
        )
