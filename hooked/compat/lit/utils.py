"""Small helpers of `transformer_lens.lit`: tensor/array conversion, token cleaning, batching, model facts."""

from __future__ import annotations

import importlib.util
from typing import Any

import numpy as np
import torch


def check_lit_installed() -> bool:
    """Whether `lit_nlp` (the LIT package, `pip install lit-nlp`) can be imported."""
    try:
        return importlib.util.find_spec("lit_nlp") is not None
    except (ImportError, ValueError):
        return False


def tensor_to_numpy(x: torch.Tensor | np.ndarray | None) -> np.ndarray | None:
    """A detached CPU float copy of a tensor as an array; arrays and None pass through unchanged."""
    if x is None or isinstance(x, np.ndarray):
        return x
    x = x.detach().cpu()
    return (x.float() if x.dtype in (torch.bfloat16, torch.float16) else x).numpy()


def numpy_to_tensor(
    x: np.ndarray, device: str | torch.device | None = None, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """An array as a tensor, on `device` and in `dtype` if given."""
    return torch.as_tensor(x, device=device, dtype=dtype)


def clean_token_string(token: str) -> str:
    """One display convention for word starts: GPT-2's `Ġ` becomes SentencePiece's `▁`; BERT's `##` suffix mark goes."""
    if token.startswith("Ġ"):
        return "▁" + token[1:]
    if token.startswith("##"):
        return token[2:]
    return token


def clean_token_strings(tokens: list[str]) -> list[str]:
    return [clean_token_string(t) for t in tokens]


def batch_examples(examples: list, batch_size: int) -> list[list]:
    """Consecutive batches of `batch_size` examples (the last one may be shorter)."""
    return [examples[i : i + batch_size] for i in range(0, len(examples), batch_size)]


def unbatch_outputs(batched: dict[str, Any]) -> list[dict[str, Any]]:
    """`{field: [batch, ...]}` -> one `{field: value}` dict per example."""
    if not batched:
        return []
    n = len(next(iter(batched.values())))
    return [{field: values[i] for field, values in batched.items()} for i in range(n)]


def get_hook_name_for_layer(template: str, layer: int, **kwargs) -> str:
    return template.format(layer=layer, **kwargs)


def get_model_info(model: Any) -> dict[str, Any]:
    """The config facts LIT shows about a model."""
    cfg = model.cfg
    fields = (
        "model_name",
        "n_layers",
        "n_heads",
        "d_model",
        "d_head",
        "d_mlp",
        "d_vocab",
        "n_ctx",
        "act_fn",
        "normalization_type",
        "positional_embedding_type",
        "device",
    )
    return {f: getattr(cfg, f, None) for f in fields}
