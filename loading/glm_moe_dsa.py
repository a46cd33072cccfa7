"""GLM-MoE-DSA (`GlmMoeDsaForCausalLM`, GLM-5): DeepSeek-V3's latent attention and router, plus sparse attention.

The layers are DeepSeek-V3's (`loading/deepseek.py`): multi-head latent attention with the
rotary dims as interleaved pairs, a sigmoid router with a correction bias, shared experts and
dense layers where `mlp_layer_types` says `"dense"`. New is DeepSeek sparse attention
(`components/dsa.py`): each layer's indexer (`self_attn.indexer.wq_b`, `wk`, `k_norm`,
`weights_proj`) scores every earlier key for every query and the attention keeps the
`index_topk` best; a layer whose `indexer_types` entry is `"shared"` reuses the previous
layer's selection.

Decoding with HF's cache scores each new query against the cached indexer keys; HF's full
forward scores all queries at once. The two pick the same keys up to float rounding of
near-ties; `generate` here matches HF's cached decode.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from hooked.loading.common import heads_in
from hooked.loading.config_checks import require_supported
from hooked.loading.deepseek import convert_deepseek_weights, mla_config, routed_experts_config, sigmoid_routing
from hooked.loading.registry import register_architecture

FAMILY = "GlmMoeDsaForCausalLM"


def convert_glm_moe_dsa_config(hf: Any) -> dict:
    require_supported(hf, FAMILY, "layer_types", lambda t: set(t or ["indexed_attention"]) == {"indexed_attention"},
                      describe="every layer 'indexed_attention'")  # fmt: skip
    indexer = require_supported(hf, FAMILY, "indexer_types", lambda t: set(t) <= {"full", "shared"},
                                describe="'full' or 'shared' per layer")  # fmt: skip
    return dict(
        mla_config(hf, FAMILY),
        **routed_experts_config(hf, [i for i, kind in enumerate(hf.mlp_layer_types) if kind == "dense"]),
        **sigmoid_routing(hf),
        rotary_interleaved_input=True,  # HF's GLM-MoE-DSA always rotates interleaved pairs
        index_n_heads=hf.index_n_heads,
        index_d_head=hf.index_head_dim,
        index_topk=hf.index_topk,
        index_shared_layers=[i for i, kind in enumerate(indexer) if kind == "shared"] or None,
        default_prepend_bos=False,
        original_architecture=FAMILY,
    )


def indexer_weights(hf: Mapping[str, torch.Tensor], p: str, cfg) -> dict[str, torch.Tensor]:
    """`self_attn.indexer.*` -> `attn.indexer.*` (views)."""
    return {
        "attn.indexer.W_Q": heads_in(hf[p + "wq_b.weight"], cfg.index_n_heads, cfg.index_d_head),  # [H_I, q_rank, D_I]
        "attn.indexer.W_K": hf[p + "wk.weight"].T,  # [d_model, D_I]
        "attn.indexer.k_norm.w": hf[p + "k_norm.weight"],
        "attn.indexer.k_norm.b": hf[p + "k_norm.bias"],
        "attn.indexer.W_weights": hf[p + "weights_proj.weight"].T,  # [d_model, H_I]
    }


def convert_glm_moe_dsa_weights(hf_state: Mapping[str, torch.Tensor], cfg) -> dict[str, torch.Tensor]:
    sd = convert_deepseek_weights(hf_state, cfg)
    shared = set(cfg.index_shared_layers or ())
    for layer in range(cfg.n_layers):
        if layer not in shared:
            weights = indexer_weights(hf_state, f"model.layers.{layer}.self_attn.indexer.", cfg)
            sd.update({f"blocks.{layer}.{k}": v for k, v in weights.items()})
    return sd


register_architecture((FAMILY,), convert_glm_moe_dsa_config, convert_glm_moe_dsa_weights)
