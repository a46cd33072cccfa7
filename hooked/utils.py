"""Small shared utilities: hook-name shorthands, the LM loss, padding masks."""

from __future__ import annotations

import re

import numpy as np
import torch
import torch.nn.functional as F
from jaxtyping import Float, Int


class _UseDefault:
    """Sentinel: use the model's default for this argument."""

    def __repr__(self) -> str:
        return "USE_DEFAULT_VALUE"


USE_DEFAULT_VALUE = _UseDefault()

_NAME_ALIASES = {
    "attn": "pattern",
    "attn_logits": "attn_scores",
    "key": "k",
    "query": "q",
    "value": "v",
    "mlp_pre": "pre",
    "mlp_mid": "mid",
    "mlp_post": "post",
}
_LAYER_TYPE_ALIASES = {"a": "attn", "attention": "attn", "m": "mlp", "b": None, "block": None, "blocks": None}
_ATTN_NAMES = {"q", "k", "v", "z", "rot_q", "rot_k", "result", "pattern", "attn_scores"}
_MLP_NAMES = {"pre", "post", "mid", "pre_linear"}


def get_act_name(name: str, layer: int | None = None, layer_type: str | None = None) -> str:
    """Expand a shorthand into a full hook name: `("pattern", 0)` -> `blocks.0.attn.hook_pattern`.

    Accepts compact forms like `"k6"` and `"scale4ln1"`; a full name (with a dot or a
    `hook_` prefix) and no layer is returned unchanged.
    """
    if ("." in name or name.startswith("hook_")) and layer is None and layer_type is None:
        return name
    match = re.fullmatch(r"([a-z_]+)(\d+)([a-z_0-9]*)", name)
    if match is not None and layer is None:
        name, layer, layer_type = match.group(1), int(match.group(2)), match.group(3) or None
    name = _NAME_ALIASES.get(name, name)
    if layer_type is not None:
        layer_type = _LAYER_TYPE_ALIASES.get(layer_type, layer_type)
    if layer_type is None and name in _ATTN_NAMES:
        layer_type = "attn"
    elif layer_type is None and name in _MLP_NAMES:
        layer_type = "mlp"
    if layer is None:
        return f"ln_final.hook_{name}" if name in ("scale", "normalized") else f"hook_{name}"
    return f"blocks.{layer}.{layer_type + '.' if layer_type else ''}hook_{name}"


def lm_cross_entropy_loss(
    logits: Float[torch.Tensor, "batch pos d_vocab"],
    tokens: Int[torch.Tensor, "batch pos"],
    attention_mask: Int[torch.Tensor, "batch pos"] | None = None,
    per_token: bool = False,
) -> Float[torch.Tensor, ""] | Float[torch.Tensor, "batch pos_minus_1"]:
    """Next-token cross-entropy in float32, averaged over kept pairs (t, t+1).

    A pair is kept iff both tokens are real (`mask[t] & mask[t+1]`). Per-token loss is
    0 at dropped positions.
    """
    log_probs = F.log_softmax(logits[:, :-1].float(), dim=-1)
    nll = -log_probs.gather(-1, tokens[:, 1:, None]).squeeze(-1)  # [batch, pos-1]
    if attention_mask is None:
        return nll if per_token else nll.mean()
    keep = (attention_mask[:, :-1].bool() & attention_mask[:, 1:].bool()).to(nll.dtype)
    nll = nll * keep
    return nll if per_token else nll.sum() / keep.sum().clamp(min=1)


def lm_accuracy(
    logits: Float[torch.Tensor, "batch pos d_vocab"], tokens: Int[torch.Tensor, "batch pos"], per_token: bool = False
):
    """Fraction of positions whose argmax is the next token."""
    correct = logits[:, :-1].argmax(-1) == tokens[:, 1:]
    return correct if per_token else correct.float().mean()


def get_attention_mask(tokenizer, tokens: Int[torch.Tensor, "batch pos"], prepend_bos: bool) -> torch.Tensor:
    """Infer a left-padding mask from pad ids (TransformerLens's rule for raw tokens).

    Leading pad tokens are masked; when BOS equals the pad token, the BOS just before
    the first real token is kept.
    """
    pad = tokenizer.pad_token_id
    is_real = tokens.ne(pad)
    mask = is_real.cumsum(dim=-1) > 0
    if prepend_bos and tokenizer.bos_token_id == pad:
        first_real = is_real.long().argmax(dim=-1)
        rows = torch.arange(tokens.shape[0], device=tokens.device)
        mask[rows, (first_real - 1).clamp(min=0)] = True
    return mask.long()


def positions_from_mask(mask: Int[torch.Tensor, "batch pos"]) -> Int[torch.Tensor, "batch pos"]:
    """Position ids `cumsum(mask) - 1`, clamped at 0, so left-padded rows start at 0."""
    return (mask.long().cumsum(-1) - 1).clamp(min=0)


def to_numpy(x) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().numpy()
    return np.asarray(x)


def remove_batch_dim(x: torch.Tensor) -> torch.Tensor:
    return x[0] if x.shape[0] == 1 else x
