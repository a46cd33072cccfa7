"""BERT (`BertForMaskedLM`, `BertForPreTraining`, `BertForNextSentencePrediction`, `BertModel`).

Post-LN encoder: summed token/position/token-type embeddings then LayerNorm, blocks whose
norms follow each residual add, and up to three heads (masked-LM transform + tied
unembedding, pooler, next-sentence classifier). A checkpoint without a head converts
without it: `convert_bert_weights` returns only what the checkpoint holds, and
`present_heads` says which heads those are.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from hooked.loading.common import ACT_FN_NAMES, act_fn_name, strip_prefix  # noqa: F401  (ACT_FN_NAMES: importable from here before)
from hooked.loading.config_checks import require_activation, require_supported
from hooked.loading.parts import dense_mlp, layer_norm, prefixed, projections
from hooked.loading.registry import register_model_class_architecture

HEAD_PREFIXES = {"mlm": "mlm_head.", "pooler": "pooler.", "nsp": "nsp_head."}  # optional parts of a checkpoint
BERT_CLASSES = ("BertForMaskedLM", "BertForPreTraining", "BertForNextSentencePrediction", "BertModel")


def convert_bert_config(hf) -> dict:
    """HF `BertConfig` -> `HookedTransformerConfig` fields (absolute positions only)."""
    require_supported(hf, "BERT", "position_embedding_type", ("absolute", None), default="absolute")
    require_supported(  # a causal BERT, not an encoder
        hf, "BERT", "is_decoder", (False,), default=False, describe="HookedEncoder is bidirectional: False"
    )
    return encoder_config(
        hf, hf.hidden_size, hf.num_attention_heads, hf.intermediate_size, hf.num_hidden_layers, hf.layer_norm_eps,
        require_activation(hf, "hidden_act"), "BertForMaskedLM",
    )  # fmt: skip


def encoder_config(hf, d_model: int, n_heads: int, d_mlp: int, n_layers: int, eps: float, act: str, arch: str) -> dict:
    """The `HookedEncoder` fields of a BERT-style post-LN encoder (learned positions, LayerNorm)."""
    return dict(
        d_model=d_model, d_head=d_model // n_heads, n_heads=n_heads, d_mlp=d_mlp, n_layers=n_layers,
        n_ctx=hf.max_position_embeddings, eps=eps, d_vocab=hf.vocab_size, act_fn=act, attention_dir="bidirectional",
        normalization_type="LN", positional_embedding_type="standard", initializer_range=hf.initializer_range,
        original_architecture=arch,
    )  # fmt: skip


def convert_bert_weights(hf_state: Mapping[str, torch.Tensor], cfg) -> dict[str, torch.Tensor]:
    """HF BERT state dict (any of `BERT_CLASSES`) -> `HookedEncoder` names and shapes (views, no copies)."""
    hf = strip_prefix(hf_state, "bert.")
    d = cfg.d_model
    sd = {
        "embed.embed.W_E": hf["embeddings.word_embeddings.weight"],
        "embed.pos_embed.W_pos": hf["embeddings.position_embeddings.weight"],
        "embed.token_type_embed.W_token_type": hf["embeddings.token_type_embeddings.weight"],
        **layer_norm(hf, "embeddings.LayerNorm", "embed.ln", d),
    }
    for layer_i in range(cfg.n_layers):
        p = f"encoder.layer.{layer_i}."
        block = {
            **projections(hf, p + "attention.", ("self.query", "self.key", "self.value", "output.dense"), cfg),
            **layer_norm(hf, p + "attention.output.LayerNorm", "ln1", d),
            **dense_mlp(hf, p + "intermediate.dense", p + "output.dense"),
            **layer_norm(hf, p + "output.LayerNorm", "ln2", d),
        }
        sd.update(prefixed(f"blocks.{layer_i}.", block))
    sd.update(_pooler(hf))
    sd.update(_mlm_head(hf_state, sd["embed.embed.W_E"], d))
    sd.update(_nsp_head(hf_state))
    return sd


def _pooler(hf: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    if "pooler.dense.weight" not in hf:  # BertForMaskedLM has none
        return {}
    return {"pooler.W": hf["pooler.dense.weight"].T, "pooler.b": hf["pooler.dense.bias"]}  # W: [d_model, d_model]


def _mlm_head(hf: Mapping[str, torch.Tensor], W_E: torch.Tensor, d: int) -> dict[str, torch.Tensor]:
    p = "cls.predictions."
    if p + "transform.dense.weight" not in hf:
        return {}
    decoder = hf.get(p + "decoder.weight", W_E)  # tied to the word embeddings (safetensors stores it once)
    bias = hf[p + "bias"] if p + "bias" in hf else hf[p + "decoder.bias"]
    return {
        "mlm_head.W": hf[p + "transform.dense.weight"].T,  # [d_model, d_model]
        "mlm_head.b": hf[p + "transform.dense.bias"],
        **layer_norm(hf, p + "transform.LayerNorm", "mlm_head.ln", d),
        "unembed.W_U": decoder.T,  # [d_model, d_vocab]
        "unembed.b_U": bias,
    }


def _nsp_head(hf: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    if "cls.seq_relationship.weight" not in hf:
        return {}
    return {
        "nsp_head.W": hf["cls.seq_relationship.weight"].T,
        "nsp_head.b": hf["cls.seq_relationship.bias"],
    }  # W: [d_model, 2]


def present_heads(converted: Mapping[str, torch.Tensor]) -> set[str]:
    """Which of `mlm`, `pooler`, `nsp` a converted state dict holds."""
    return {head for head, prefix in HEAD_PREFIXES.items() if any(k.startswith(prefix) for k in converted)}


for _name in BERT_CLASSES:
    register_model_class_architecture(_name, "HookedEncoder", convert_bert_config, convert_bert_weights)
