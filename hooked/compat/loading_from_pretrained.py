"""`transformer_lens.loading_from_pretrained`: the `loading` package plus TransformerLens's helper names."""

from __future__ import annotations

import logging

import torch

from hooked.loading import *  # noqa: F401,F403
from hooked.loading import get_official_model_name

logger = logging.getLogger(__name__)

TL_GEMMA3_N_CTX = 8192  # TransformerLens's default context for Gemma 3 (the models support 32K/128K)


def __getattr__(name: str):
    if name == "AutoConfig":  # TransformerLens code patches `loading_from_pretrained.AutoConfig`
        from transformers import AutoConfig

        return AutoConfig
    raise AttributeError(f"module 'transformer_lens.loading_from_pretrained' has no attribute {name!r}")


def get_pretrained_model_config(
    model_name: str,
    hf_cfg: dict | None = None,
    checkpoint_index: int | None = None,
    checkpoint_value: int | None = None,
    fold_ln: bool = False,
    device=None,
    n_devices: int = 1,
    default_prepend_bos: bool | None = None,
    dtype: torch.dtype = torch.float32,
    first_n_layers: int | None = None,
    n_ctx: int | None = None,
    **kwargs,
):
    """The `HookedTransformerConfig` of a TransformerLens name, hub id or local checkpoint (config only).

    Official names listed in `loading.official_configs` need no hub access (as in
    TransformerLens, whose tables hard-code them); Gemma 3 then defaults to TransformerLens's
    memory-safe `n_ctx=8192` (pass `n_ctx=` for the full context).
    """
    from hooked.loading.checkpoint import load_hf_config
    from hooked.loading.official_configs import official_hf_config
    from hooked.loading.pretrained import _local_directory, build_config, hf_architecture

    official_name = get_official_model_name(model_name)
    hf_config = official_hf_config(official_name)
    if hf_config is None:
        hf_config = load_hf_config(_local_directory(model_name, **kwargs))
    elif n_ctx is None and hf_config.model_type == "gemma3_text":
        n_ctx = min(TL_GEMMA3_N_CTX, hf_config.max_position_embeddings)
    cfg = build_config(
        hf_config,
        hf_architecture(hf_config),
        official_name,
        n_layers=first_n_layers,
        default_prepend_bos=default_prepend_bos,
        dtype=dtype,
        device=device,
        n_devices=n_devices,
    )
    if n_ctx is not None:
        if n_ctx > cfg.n_ctx:
            logging.warning(
                f"You are setting n_ctx={n_ctx} which is larger than this model's default context length of "
                f"{cfg.n_ctx}. The model was not trained on sequences this long and may produce unreliable results. "
                "Ensure you have sufficient memory for this context length."
            )
        cfg = cfg.replace(n_ctx=n_ctx)
    if fold_ln:
        cfg = cfg.replace(
            normalization_type={"LN": "LNPre", "RMS": "RMSPre"}.get(
                cfg.normalization_type or "", cfg.normalization_type
            )
        )
    return cfg


def fill_missing_keys(model: torch.nn.Module, state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Fill keys `state_dict` lacks with the model's current tensors (warning for weight matrices)."""
    default = model.state_dict()
    for key in set(default) - set(state_dict):
        if "hf_model" in key:
            continue
        if "W_" in key:
            logging.warning(f"Missing key for a weight matrix in pretrained, filled in with an empty tensor: {key}")
        state_dict[key] = default[key]
    return state_dict
