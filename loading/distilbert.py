"""DistilBERT (`DistilBertForMaskedLM`, `DistilBertModel`): BERT's post-LN blocks without token types or pooler.

It fits `HookedEncoder` unchanged: the token-type embedding is zero (DistilBERT has no
segments), positions count from 0 as in BERT, and every LayerNorm has eps 1e-12.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from hooked.loading.bert import encoder_config
from hooked.loading.common import ACT_FN_NAMES, act_fn_name, strip_prefix  # noqa: F401  (ACT_FN_NAMES: importable from here before)
from hooked.loading.config_checks import require_activation
from hooked.loading.parts import dense_mlp, layer_norm, prefixed, projections
from hooked.loading.registry import register_model_class_architecture

DISTILBERT_CLASSES = ("DistilBertForMaskedLM", "DistilBertModel")
EPS = 1e-12  # hard-coded in HF's DistilBERT


def convert_distilbert_config(hf) -> dict:
    act = require_activation(hf, "activation")
    return encoder_config(hf, hf.dim, hf.n_heads, hf.hidden_dim, hf.n_layers, EPS, act, "DistilBertForMaskedLM")


def convert_distilbert_weights(hf_state: Mapping[str, torch.Tensor], cfg) -> dict[str, torch.Tensor]:
    """HF DistilBERT state dict -> `HookedEncoder` names and shapes (a zero token-type embedding)."""
    hf = strip_prefix(hf_state, "distilbert.")
    d = cfg.d_model
    W_E = hf["embeddings.word_embeddings.weight"]
    sd = {
        "embed.embed.W_E": W_E,
        "embed.pos_embed.W_pos": hf["embeddings.position_embeddings.weight"],
        "embed.token_type_embed.W_token_type": torch.zeros(2, d, dtype=W_E.dtype),  # no segments
        **layer_norm(hf, "embeddings.LayerNorm", "embed.ln", d),
    }
    for layer_i in range(cfg.n_layers):
        p = f"transformer.layer.{layer_i}."
        block = {
            **projections(hf, p + "attention.", ("q_lin", "k_lin", "v_lin", "out_lin"), cfg),
            **layer_norm(hf, p + "sa_layer_norm", "ln1", d),
            **dense_mlp(hf, p + "ffn.lin1", p + "ffn.lin2"),
            **layer_norm(hf, p + "output_layer_norm", "ln2", d),
        }
        sd.update(prefixed(f"blocks.{layer_i}.", block))
    if "vocab_transform.weight" in hf_state:
        sd.update(
            {
                "mlm_head.W": hf_state["vocab_transform.weight"].T,  # [d_model, d_model]
                "mlm_head.b": hf_state["vocab_transform.bias"],
                **layer_norm(hf_state, "vocab_layer_norm", "mlm_head.ln", d),
                "unembed.W_U": hf_state.get("vocab_projector.weight", W_E).T,  # tied: [d_model, d_vocab]
                "unembed.b_U": hf_state["vocab_projector.bias"],
            }
        )
    return sd


for _name in DISTILBERT_CLASSES:
    register_model_class_architecture(_name, "HookedEncoder", convert_distilbert_config, convert_distilbert_weights)
