"""Phi-3 / Phi-3.5 / Phi-4-mini (`Phi3ForCausalLM`): a LLaMA-shaped decoder with fused projections.

    qkv = qkv_proj(n)           # [Q; K; V] stacked by rows: H*dh, Hkv*dh, Hkv*dh
    gate, up = gate_up_proj(n).chunk(2)   # the gate is the first half

Everything else is `loading/llama.py`'s: RMSNorm, NeoX half-split rotary (over
`partial_rotary_factor * head_dim` dims; Phi-4-mini rotates 3/4 of each head),
`sliding_window` on every layer when set, and LongRoPE (`rope_type: longrope`: short
factors up to `original_max_position_embeddings`, long ones beyond, cos/sin scaled by
the attention factor). `Phi3AsLlama` presents the fused tensors under LLaMA's names, as
views, so the LLaMA converter does the rest.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from hooked.loading.llama import convert_llama_weights, llama_shaped_config, local_attention
from hooked.loading.registry import register_architecture

_QKV = re.compile(r"(.*self_attn\.)([qkv])_proj\.weight$")
_GATE_UP = re.compile(r"(.*mlp\.)(gate|up)_proj\.weight$")


class Phi3AsLlama(Mapping):
    """A read-only view of a Phi-3 state dict with `qkv_proj`/`gate_up_proj` split into LLaMA's projections."""

    def __init__(self, state: Mapping[str, torch.Tensor], n_heads: int, n_kv_heads: int, d_head: int):
        self.state = state
        q, kv = n_heads * d_head, n_kv_heads * d_head
        self.rows = {"q": (0, q), "k": (q, q + kv), "v": (q + kv, q + 2 * kv)}

    def __getitem__(self, key: str) -> torch.Tensor:
        if (m := _QKV.match(key)) and m[1] + "qkv_proj.weight" in self.state:
            start, stop = self.rows[m[2]]
            return self.state[m[1] + "qkv_proj.weight"][start:stop]  # [rows, d_model]
        if (m := _GATE_UP.match(key)) and m[1] + "gate_up_proj.weight" in self.state:
            gate, up = self.state[m[1] + "gate_up_proj.weight"].chunk(2, dim=0)  # [d_mlp, d_model] each
            return gate if m[2] == "gate" else up
        return self.state[key]

    def __contains__(self, key) -> bool:  # without loading anything
        if (m := _QKV.match(key)) and m[1] + "qkv_proj.weight" in self.state:
            return True
        if (m := _GATE_UP.match(key)) and m[1] + "gate_up_proj.weight" in self.state:
            return True
        return key in self.state

    def __iter__(self) -> Iterator[str]:
        return iter(self.state)

    def __len__(self) -> int:
        return len(self.state)


def convert_phi3_config(hf: Any) -> dict:
    fields = llama_shaped_config(hf, "Phi3ForCausalLM")
    partial = (getattr(hf, "rope_parameters", None) or {}).get("partial_rotary_factor")
    partial = partial or getattr(hf, "partial_rotary_factor", None) or 1.0
    return dict(
        fields,
        rotary_dim=int(fields["d_head"] * partial),
        **local_attention(getattr(hf, "sliding_window", None), [True] * hf.num_hidden_layers),
        default_prepend_bos=True,
    )


def convert_phi3_weights(hf_state: Mapping[str, torch.Tensor], cfg) -> dict[str, torch.Tensor]:
    return convert_llama_weights(Phi3AsLlama(hf_state, cfg.n_heads, cfg.n_kv_heads, cfg.d_head), cfg)


register_architecture(("Phi3ForCausalLM",), convert_phi3_config, convert_phi3_weights)
