"""Gemma 1, 2 and 3 (and the language model of Gemma 3's image-text checkpoints).

    x = embed_tokens(tokens) * sqrt(d_model)
    per layer:  x += post_attention_norm(o_proj(attention(input_norm(x))))     # Gemma 1: no post norm
                x += post_feedforward_norm(down(gelu_tanh(gate(n)) * up(n)))   # n = pre_feedforward_norm(x)
    logits = soft_cap(lm_head(norm(x)))

Every norm is RMSNorm with gain `1 + w`, applied in float32 before the cast
(`RMSNormGainFirst`); the `+ 1` is added here, so `ln*.w` holds the gain itself as in
TransformerLens and `fold_ln` folds `1 + w`. The embedding scale `sqrt(d_model)` (cast to
the weight dtype, as HF does) is folded into `W_E`; a tied `W_U` keeps the unscaled
embedding, so the two no longer share storage.

Half precision: the gains stay float32, `1 + w` with `w` rounded to the model dtype as HF's
half-precision model computes it (`RMSNormGainFirst.cast_parameter`), so a model built from
HF's model in that dtype (or from a checkpoint stored in any dtype) equals HF bit for bit; `W_E`
is `sqrt(d_model) * e` computed as HF's model does, in its dtype (`scaled_embedding`).

| family  | sublayer norms              | attention                                             | rotary                            |
|---------|-----------------------------|-------------------------------------------------------|-----------------------------------|
| Gemma 1 | pre only (`ln1`, `ln2`)     | MQA/MHA, scale 1/sqrt(head_dim)                       | one base                          |
| Gemma 2 | sandwich (`ln1_post`, `ln2_post`) | soft-cap 50, sliding on `layer_types`, scale 1/sqrt(`query_pre_attn_scalar`); final soft-cap 30 | one base |
| Gemma 3 | sandwich                    | qk-norm `(1 + w)` per head, sliding 5:1, no soft-caps | per layer type (local 10k, global 1M, `linear` on global) |

Gemma 2's HF norm names: `input_layernorm` -> `ln1`, `post_attention_layernorm` ->
`ln1_post`, `pre_feedforward_layernorm` -> `ln2`, `post_feedforward_layernorm` ->
`ln2_post`. In Gemma 1, `post_attention_layernorm` is the pre-MLP norm `ln2`.
"""  # noqa: E501 - a markdown table keeps each row on one line

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any

import torch

from hooked.loading.common import (  # noqa: F401  (ACT_FN_NAMES: importable from here before)
    ACT_FN_NAMES,
    hf_rope_parameters,
    per_layer_type_rope,
    strip_prefix,
    unembed_weights,
)
from hooked.loading.config_checks import require_activation, require_supported
from hooked.loading.llama import attention_weights, gated_mlp_weights, local_attention
from hooked.loading.registry import register_architecture

logger = logging.getLogger(__name__)

# -- config -----------------------------------------------------------------------------


def gemma_config(hf: Any, architecture: str) -> dict:
    """Fields shared by every Gemma generation."""
    require_supported(  # EmbeddingGemma: an encoder
        hf,
        "Gemma",
        "use_bidirectional_attention",
        (None, False),
        describe="causal attention only: Bidirectional Gemma (EmbeddingGemma) is an encoder",
    )
    return dict(
        d_model=hf.hidden_size,
        d_head=hf.head_dim,
        n_heads=hf.num_attention_heads,
        n_key_value_heads=hf.num_key_value_heads,
        d_mlp=hf.intermediate_size,
        n_layers=hf.num_hidden_layers,
        n_ctx=hf.max_position_embeddings,
        d_vocab=hf.vocab_size,
        act_fn=require_activation(hf, "hidden_activation" if getattr(hf, "hidden_activation", None) else "hidden_act"),
        gated_mlp=True,
        eps=hf.rms_norm_eps,
        normalization_type="RMS",
        norm_gain_in_fp32=True,
        norm_gain_offset=1.0,  # HF multiplies by `1 + w` (in float32): `ln*.w` holds the sum
        positional_embedding_type="rotary",
        rotary_dim=hf.head_dim,
        embed_scale=hf.hidden_size**0.5,
        default_prepend_bos=True,
        original_architecture=architecture,
    )


def _soft_cap(value: float | None) -> float:
    return float(value) if value else -1.0


def _sandwich_config(hf: Any) -> dict:
    """Gemma 2/3: post-sublayer norms, `query_pre_attn_scalar`, soft-caps, sliding layers."""
    layer_types = hf.layer_types
    return dict(
        use_normalization_before_and_after=True,
        attn_scale=math.sqrt(hf.query_pre_attn_scalar),
        attn_scores_soft_cap=_soft_cap(hf.attn_logit_softcapping),
        output_logits_soft_cap=_soft_cap(hf.final_logit_softcapping),
        **local_attention(hf.sliding_window, [kind == "sliding_attention" for kind in layer_types]),
    )


def convert_gemma_config(hf: Any) -> dict:
    base, scaling = hf_rope_parameters(hf)
    return dict(gemma_config(hf, "GemmaForCausalLM"), rotary_base=base, rotary_scaling=scaling)


def convert_gemma2_config(hf: Any) -> dict:
    base, scaling = hf_rope_parameters(hf)
    return dict(gemma_config(hf, "Gemma2ForCausalLM"), **_sandwich_config(hf), rotary_base=base, rotary_scaling=scaling)


def convert_gemma3_config(hf: Any) -> dict:
    """`Gemma3ForCausalLM` (a `Gemma3TextConfig`), or an image-text `Gemma3Config` (its `text_config`)."""
    text = getattr(hf, "text_config", None) or hf
    return dict(
        gemma_config(text, "Gemma3ForCausalLM"), **_sandwich_config(text), **per_layer_type_rope(text), use_qk_norm=True
    )


# -- weights ----------------------------------------------------------------------------

# Key prefixes of the decoder in memory (transformers 5) and on disk, most specific first.
_DECODER_PREFIXES = ("model.language_model.", "language_model.model.", "model.")


def _decoder_prefix(hf_state: Mapping[str, torch.Tensor]) -> str:
    for prefix in _DECODER_PREFIXES:
        if prefix + "embed_tokens.weight" in hf_state:
            return prefix
    return ""


def _gain(w: torch.Tensor) -> torch.Tensor:
    """Gemma's RMSNorm multiplies by `1 + w` (in float32): store the gain itself.

    In float64, where `1 + w` is exact: a half-precision model rounds `w` (not the sum) to its
    dtype before adding 1, as HF (`RMSNormGainFirst.cast_parameter`); processing reads float32.
    """
    return w.double() + 1.0


def scaled_embedding(embed: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    """`embed * scale` as HF's model in `dtype` computes it: both rounded to `dtype`, multiplied there.

    Returned in the wider of the checkpoint's dtype and `dtype`, so the later cast to `dtype` is exact:
    a float32 checkpoint loaded into bfloat16 gets HF's bfloat16 embeddings bit for bit.
    """
    product = embed.to(dtype) * torch.tensor(scale, dtype=torch.float32).to(dtype)  # [d_vocab, d_model]
    return product.to(torch.promote_types(embed.dtype, dtype))


def convert_gemma_weights(hf_state: Mapping[str, torch.Tensor], cfg) -> dict[str, torch.Tensor]:
    """HF Gemma 1/2/3 state dict -> TransformerLens names, norm gains `1 + w`, `W_E` scaled by sqrt(d_model)."""
    hf = strip_prefix(hf_state, _decoder_prefix(hf_state))
    embed = hf["embed_tokens.weight"]  # [d_vocab, d_model]
    sd = {"embed.W_E": scaled_embedding(embed, cfg.embed_scale, cfg.dtype)}
    sandwich = cfg.use_normalization_before_and_after
    norms = (
        {
            "ln1": "input_layernorm",
            "ln1_post": "post_attention_layernorm",
            "ln2": "pre_feedforward_layernorm",
            "ln2_post": "post_feedforward_layernorm",
        }
        if sandwich
        else {"ln1": "input_layernorm", "ln2": "post_attention_layernorm"}
    )
    for layer in range(cfg.n_layers):
        p, b = f"layers.{layer}.", f"blocks.{layer}."
        sd.update({b + f"{ours}.w": _gain(hf[p + f"{theirs}.weight"]) for ours, theirs in norms.items()})
        attn = attention_weights(hf, p + "self_attn.", cfg)
        if cfg.use_qk_norm:
            attn["attn.q_norm.w"], attn["attn.k_norm.w"] = _gain(attn["attn.q_norm.w"]), _gain(attn["attn.k_norm.w"])
        sd.update({b + k: v for k, v in attn.items()})
        sd.update({b + k: v for k, v in gated_mlp_weights(hf, p + "mlp.", cfg).items()})
    sd["ln_final.w"] = _gain(hf["norm.weight"])
    lm_head = hf_state.get("lm_head.weight", hf_state.get("language_model.lm_head.weight"))
    sd.update(unembed_weights(lm_head, embed))  # tied: W_U is the unscaled embedding
    logger.info(
        "Gemma: embed.W_E is the embedding scaled by sqrt(d_model) = %.4f, a copy; unembed.W_U is the unscaled %s",
        cfg.embed_scale,
        "tied embedding (W_E and W_U no longer share storage)"
        if sd["unembed.W_U"].data_ptr() == embed.data_ptr()
        else "lm_head",
    )
    return sd


register_architecture(("GemmaForCausalLM",), convert_gemma_config, convert_gemma_weights)
register_architecture(("Gemma2ForCausalLM",), convert_gemma2_config, convert_gemma_weights)
register_architecture(("Gemma3ForCausalLM",), convert_gemma3_config, convert_gemma_weights)
# Gemma3ForConditionalGeneration (the text model with its vision tower): hooked.loading.gemma3_multimodal
