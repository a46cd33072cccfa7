"""Converter pieces shared by the classic families: norms, attention, MLPs and config facts.

Every function takes HF tensors in HF layout (`nn.Linear` weights `[out, in]`) and returns
TransformerLens names and shapes (views, no copies), relative to a block (`ln1.w`, `attn.W_Q`,
...). A missing bias becomes zeros.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from hooked.loading.common import ACT_FN_NAMES, bias_or_zeros, heads_in, heads_out, hf_rope_parameters  # noqa: F401  (ACT_FN_NAMES: importable from here before)
from hooked.loading.config_checks import require_activation


def layer_norm(hf: Mapping[str, torch.Tensor], key: str, name: str, size: int) -> dict[str, torch.Tensor]:
    """`{name}.w`, `{name}.b` from an HF LayerNorm at `key` (ones/zeros when it has no parameters)."""
    if key + ".weight" not in hf:  # elementwise_affine=False
        return {f"{name}.w": torch.ones(size), f"{name}.b": torch.zeros(size)}
    w = hf[key + ".weight"]
    return {f"{name}.w": w, f"{name}.b": bias_or_zeros(hf, key + ".bias", size, w)}


def shared_layer_norm(hf: Mapping[str, torch.Tensor], key: str, size: int) -> dict[str, torch.Tensor]:
    """One HF norm read by both sublayers of a parallel block (GPT-J, Phi): the same tensors as `ln1` and `ln2`."""
    ln1 = layer_norm(hf, key, "ln1", size)
    return {**ln1, "ln2.w": ln1["ln1.w"], "ln2.b": ln1["ln1.b"]}


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    o: torch.Tensor,
    biases: tuple[torch.Tensor | None, ...],
    cfg,
) -> dict[str, torch.Tensor]:
    """q/k/v `[heads * d_head, d_model]`, o `[d_model, head * d_head]` and their biases (or None) -> `attn.*`.

    Grouped-query models keep K/V at `n_key_value_heads` under `_W_K`, `_b_K`, ...
    """
    H, Hkv, dh, d = cfg.n_heads, cfg.n_kv_heads, cfg.d_head, cfg.d_model
    kv = "_" if cfg.uses_grouped_query_attention else ""
    q_b, k_b, v_b, o_b = biases
    out = {}
    for name, w, b, heads, prefix in (("Q", q, q_b, H, ""), ("K", k, k_b, Hkv, kv), ("V", v, v_b, Hkv, kv)):
        out[f"attn.{prefix}W_{name}"] = heads_in(w, heads, dh)  # [heads, d_model, d_head]
        b = torch.zeros(heads * dh, dtype=w.dtype) if b is None else b  # [heads * d_head]
        out[f"attn.{prefix}b_{name}"] = b.reshape(heads, dh)  # [heads, d_head]
    out["attn.W_O"] = heads_out(o, H, dh)  # [head, d_head, d_model]
    out["attn.b_O"] = torch.zeros(d, dtype=o.dtype) if o_b is None else o_b  # [d_model]
    return out


def projections(
    hf: Mapping[str, torch.Tensor], p: str, names: tuple[str, str, str, str], cfg
) -> dict[str, torch.Tensor]:
    """`attention` from four separate HF Linears under prefix `p` (e.g. `q_proj`, `k_proj`, `v_proj`, `out_proj`)."""
    W_q, W_k, W_v, W_o = (hf[p + n + ".weight"] for n in names)
    biases = tuple(hf.get(p + n + ".bias") for n in names)
    return attention(W_q, W_k, W_v, W_o, biases, cfg)


def dense_mlp(hf: Mapping[str, torch.Tensor], fc_in: str, fc_out: str) -> dict[str, torch.Tensor]:
    """`act(x W_in + b_in) W_out + b_out` from two HF Linears (keys without `.weight`)."""
    w_in, w_out = hf[fc_in + ".weight"], hf[fc_out + ".weight"]  # [d_mlp, d_model], [d_model, d_mlp]
    return {
        "mlp.W_in": w_in.T,  # [d_model, d_mlp]
        "mlp.b_in": bias_or_zeros(hf, fc_in + ".bias", w_in.shape[0], w_in),
        "mlp.W_out": w_out.T,  # [d_mlp, d_model]
        "mlp.b_out": bias_or_zeros(hf, fc_out + ".bias", w_out.shape[0], w_out),
    }


def prefixed(prefix: str, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {prefix + k: v for k, v in tensors.items()}


def partial_rotary_dim(hf: Any, d_head: int) -> int:
    """Rotated dims per head: `int(d_head * partial_rotary_factor)` (`rotary_pct` in old NeoX configs), as HF."""
    params = getattr(hf, "rope_parameters", None) or {}
    factor = params.get("partial_rotary_factor")
    if factor is None:
        factor = getattr(hf, "partial_rotary_factor", None) or getattr(hf, "rotary_pct", 1.0)
    return int(d_head * factor)


def decoder_config(hf: Any, d_head: int) -> dict:
    """The config fields every HF decoder names alike (`hidden_size`, `num_attention_heads`, ...)."""
    return dict(
        d_model=hf.hidden_size,
        d_head=d_head,
        n_heads=hf.num_attention_heads,
        n_layers=hf.num_hidden_layers,
        n_ctx=hf.max_position_embeddings,
        d_mlp=hf.intermediate_size,
        d_vocab=hf.vocab_size,
        act_fn=require_activation(hf, "hidden_act"),
    )


def rotary_config(hf: Any, rotary_dim: int) -> dict:
    """NeoX half-split rotary over the first `rotary_dim` dims, with the config's base and scaling."""
    rotary_base, rotary_scaling = hf_rope_parameters(hf)
    return dict(
        positional_embedding_type="rotary",
        rotary_dim=rotary_dim,
        rotary_base=rotary_base,
        rotary_scaling=rotary_scaling,
    )
