"""Head detector (TransformerLens API): how closely each head's attention matches a pattern.

A detection pattern is a lower-triangular `[pos, pos]` matrix saying where an ideal
head of some kind attends (e.g. a previous-token head puts all weight at (i, i-1)).
`detect_head` scores every head's cached attention pattern against it.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from typing import Any, Literal

import torch
from jaxtyping import Float, Int

from hooked.analysis.layer_types import require_attention_layer
from hooked.core.errors import InputError
from hooked.core.utils import is_lower_triangular, is_square

logger = logging.getLogger(__name__)

HeadName = Literal["previous_token_head", "duplicate_token_head", "induction_head"]
ErrorMeasure = Literal["abs", "mul"]
HEAD_NAMES = ("previous_token_head", "duplicate_token_head", "induction_head")


def get_supported_heads() -> list[str]:
    """Names accepted as `detection_pattern` by `detect_head`."""
    return list(HEAD_NAMES)


def get_previous_token_head_detection_pattern(tokens: Int[torch.Tensor, "... pos"]) -> Float[torch.Tensor, "pos pos"]:
    """1 at (i, i-1): each token attends to the one before it."""
    n = tokens.shape[-1]
    return torch.diag(torch.ones(n - 1), diagonal=-1)


def get_duplicate_token_head_detection_pattern(tokens: Int[torch.Tensor, "... pos"]) -> Float[torch.Tensor, "pos pos"]:
    """1 at (i, j < i) where token i equals token j: attend to earlier copies of yourself."""
    toks = tokens.reshape(-1).cpu()  # [pos]
    same = toks[:, None] == toks[None, :]  # [pos, pos]
    return torch.tril(same.float(), diagonal=-1)


def get_induction_head_detection_pattern(tokens: Int[torch.Tensor, "... pos"]) -> Float[torch.Tensor, "pos pos"]:
    """The duplicate pattern shifted one column right: attend to the token after an earlier copy."""
    duplicate = get_duplicate_token_head_detection_pattern(tokens)
    shifted = torch.roll(duplicate, shifts=1, dims=1)
    shifted[:, 0] = 0
    return torch.tril(shifted)


_BUILDERS = {
    "previous_token_head": get_previous_token_head_detection_pattern,
    "duplicate_token_head": get_duplicate_token_head_detection_pattern,
    "induction_head": get_induction_head_detection_pattern,
}


def compute_head_attention_similarity_score(
    attention_pattern: Float[torch.Tensor, "pos pos"],
    detection_pattern: Float[torch.Tensor, "pos pos"],
    *,
    exclude_bos: bool,
    exclude_current_token: bool,
    error_measure: ErrorMeasure,
) -> float:
    """Score one head: `mul` = share of attention on the pattern; `abs` = 1 - rounded mean |A - P| * pos.

    The exclusions zero column 0 (BOS) or the diagonal of a copy of the pattern.
    """
    if not is_square(attention_pattern):
        raise InputError(f"attention pattern must be square, got {tuple(attention_pattern.shape)}")
    attention = attention_pattern.detach().float().clone()
    detection = detection_pattern.to(attention.device, attention.dtype)
    if exclude_bos:
        attention[:, 0] = 0
    if exclude_current_token:
        attention.fill_diagonal_(0)
    if error_measure == "abs":
        abs_diff = (attention - detection).abs()
        return 1 - round((abs_diff.mean() * len(abs_diff)).item(), 3)
    return ((attention * detection).sum() / attention.sum()).item()


def _layer_to_heads(heads, n_layers: int, n_heads: int, cfg=None) -> dict[int, list[int]]:
    """`{layer: heads}` to score; None: every head of every attention layer (a hybrid's recurrent ones have none)."""
    if heads is None:
        layers = range(n_layers) if cfg is None else cfg.attention_layers
        return {layer: list(range(n_heads)) for layer in layers}
    if isinstance(heads, dict):
        return heads
    grouped = defaultdict(list)
    for layer, head in heads:
        grouped[layer].append(head)
    return dict(grouped)


def detect_head(
    model,
    seq: str | list[str] | Int[torch.Tensor, "pos"] | Int[torch.Tensor, "batch pos"],
    detection_pattern: Float[torch.Tensor, "pos pos"] | HeadName,
    heads: list[tuple[int, int]] | dict[int, list[int]] | None = None,
    cache=None,
    *,
    exclude_bos: bool = False,
    exclude_current_token: bool = False,
    error_measure: ErrorMeasure = "mul",
) -> Float[torch.Tensor, "n_layers n_heads"]:
    """Score each head's attention on `seq` against a detection pattern; `[n_layers, n_heads]`.

    `seq` is a prompt, a list of prompts, or token ids (`[pos]`, or `[batch, pos]` with one
    prompt per row, e.g. repeated random tokens, which need not decode to text that
    re-encodes to the same tokens). Heads not in `heads` score -1. Several prompts average
    their scores (then `cache` must be None). A given `cache` must come from this one
    prompt. `mul` scores the fraction of attention that falls on the pattern; `abs` is
    one minus the mean absolute difference times the sequence length.
    """
    cfg = model.cfg
    if error_measure not in ("abs", "mul"):
        raise InputError(f"error_measure must be 'abs' or 'mul', got {error_measure!r}")
    options: dict[str, Any] = dict(
        exclude_bos=exclude_bos, exclude_current_token=exclude_current_token, error_measure=error_measure
    )
    prompts: str | list[str] | torch.Tensor | list[torch.Tensor] = seq
    if isinstance(seq, torch.Tensor):
        rows = _token_rows(seq, cfg.d_vocab)
        prompts = rows[0] if len(rows) == 1 else rows
    if isinstance(prompts, list):
        if cache is not None:
            raise InputError("detect_head takes a cache only for a single prompt")
        scores = [detect_head(model, s, detection_pattern, heads, **options) for s in prompts]
        return torch.stack(scores).mean(0)
    tokens = prompts[None] if isinstance(prompts, torch.Tensor) else model.to_tokens(prompts)  # [1, pos]
    detection_pattern = _checked_pattern(detection_pattern, tokens, error_measure, cfg.n_ctx)
    if cache is None:
        _, cache = model.run_with_cache(tokens, names_filter=lambda name: name.endswith("hook_pattern"))
    else:
        _check_cache_matches(cache, tokens)
    scores = -torch.ones(cfg.n_layers, cfg.n_heads)
    for layer, layer_heads in _layer_to_heads(heads, cfg.n_layers, cfg.n_heads, cfg).items():
        require_attention_layer(cfg, layer, "detect_head")
        pattern = cache["pattern", layer]
        pattern = pattern[0] if pattern.ndim == 4 else pattern  # [head, query_pos, key_pos]
        for head in layer_heads:
            scores[layer, head] = compute_head_attention_similarity_score(pattern[head], detection_pattern, **options)
    return scores


def _checked_pattern(
    detection_pattern: torch.Tensor | HeadName,
    tokens: Int[torch.Tensor, "1 pos"],
    error_measure: ErrorMeasure,
    n_ctx: int,
) -> torch.Tensor:  # [pos, pos], whatever its dtype (checked here, so not in the annotation)
    """The detection pattern for `tokens` (built from a head name), checked: `[pos, pos]` and lower triangular."""
    seq_len = tokens.shape[-1]
    if isinstance(detection_pattern, str):
        if detection_pattern not in HEAD_NAMES:
            raise InputError(f"Unknown head type {detection_pattern!r}; supported: {get_supported_heads()}")
        detection_pattern = _BUILDERS[detection_pattern](tokens.cpu())
    if error_measure == "mul" and not set(detection_pattern.unique().tolist()) <= {0, 1}:
        logger.warning("error_measure 'mul' expects a binary detection pattern (0s and 1s)")
    if not 1 < seq_len < n_ctx:
        raise InputError(f"The sequence has {seq_len} tokens; it needs more than 1 and fewer than n_ctx={n_ctx}")
    if detection_pattern.shape != (seq_len, seq_len):
        raise InputError(f"The detection pattern must be {(seq_len, seq_len)}, got {tuple(detection_pattern.shape)}")
    if not is_lower_triangular(detection_pattern):
        raise InputError("The detection pattern must be lower triangular")
    return detection_pattern


def _token_rows(tokens: Int[torch.Tensor, "..."], d_vocab: int) -> list[Int[torch.Tensor, "pos"]]:
    """Token ids as a list of `[pos]` rows (one prompt each), checked to be integer ids of this model."""
    if tokens.dtype.is_floating_point or tokens.dtype == torch.bool or tokens.ndim not in (1, 2):
        raise InputError(
            f"detect_head takes token ids as an integer tensor of shape [pos] or [batch, pos], got dtype "
            f"{tokens.dtype} and shape {tuple(tokens.shape)}"
        )
    if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= d_vocab):
        raise InputError(
            f"token ids must lie in [0, {d_vocab}), got values from {int(tokens.min())} to {int(tokens.max())}"
        )
    return list(tokens.reshape(-1, tokens.shape[-1]))  # [batch, pos] -> batch rows of [pos]


def _check_cache_matches(cache, tokens: Int[torch.Tensor, "1 pos"]) -> None:
    """A cache from another input would score the wrong attention: compare its tokens (or its length)."""
    cached = getattr(cache, "tokens", None)
    if cached is not None:
        if cached.shape[-1] != tokens.shape[-1] or not torch.equal(
            cached.reshape(-1, cached.shape[-1])[0].cpu(), tokens[0].cpu()
        ):
            raise InputError(
                f"detect_head: the cache was made from other tokens ({tuple(cached.shape)}) than the input "
                f"({tuple(tokens.shape)}): pass the same prompt or token tensor that was run, or no cache"
            )
        return
    n_keys = cache["pattern", 0].shape[-1]
    if n_keys != tokens.shape[-1]:
        raise InputError(
            f"detect_head: the cache's attention patterns cover {n_keys} positions but the input has "
            f"{tokens.shape[-1]} tokens: pass the input the cache was made from, or no cache"
        )
