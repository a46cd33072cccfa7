"""Gemma 4 (`Gemma4ForCausalLM`, and the text tower of `Gemma4ForConditionalGeneration`).

    x = embed_tokens(tokens) * sqrt(d_model)
    ple = per-layer inputs from the tokens and x                (`per_layer_embed`, [b, p, layer, d_ple])
    per layer:  x += post_attention_norm(o_proj(attn(input_norm(x))))
                x += post_feedforward_norm(mlp(pre_feedforward_norm(x)))
                x += per_layer(x, ple[:, :, layer]);  x *= layer_scalar      (`Gemma4Block`)
    logits = soft_cap(lm_head(norm(x)))

Gemma 3's layout (sandwich norms, per-head q/k-norm, sliding and global layers) with:

- **norms** that multiply by `w` itself (not Gemma 3's `1 + w`), in float32 before the cast;
- **values normalized** per head without a gain (`v_norm`), and unscaled scores (scaling 1);
- **per-layer head width**: global layers have `global_head_dim` (and, with `attention_k_eq_v`,
  `num_global_key_value_heads` K/V heads whose values are their keys' projection): HF's
  `per_layer_config`, read into `layer_d_head` / `layer_n_key_value_heads`;
- **proportional rotary** on global layers (`components/rotary.py`), plain rotary on sliding ones;
- **KV sharing**: the last `num_kv_shared_layers` layers attend to the keys and values of the last
  earlier layer of their type (`kv_shared_from`), and with `use_double_wide_mlp` have MLPs twice as
  wide (`layer_d_mlp`);
- **per-layer inputs** (`components/per_layer_inputs.py`) and the learned `layer_scalar`.

The mixture-of-experts block (`enable_moe_block`, Gemma 4 26B-A4B) and bidirectional attention
are refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from hooked.loading.common import heads_in, heads_out, per_layer_type_rope, strip_prefix, unembed_weights
from hooked.loading.config_checks import require_activation, require_rope_types, require_supported
from hooked.loading.gemma import scaled_embedding
from hooked.loading.llama import gated_mlp_weights, local_attention
from hooked.loading.registry import register_architecture

_DECODER_PREFIXES = ("model.language_model.", "language_model.model.", "model.")
ROPE_TYPES = ("default", "proportional", "linear", "llama3", "yarn")


def text_config(hf: Any) -> Any:
    """The language model's config of a text-only or an image-text checkpoint."""
    return getattr(hf, "text_config", None) or hf


def kv_shared_from(text: Any) -> list[int | None] | None:
    """Per layer, the layer whose keys and values it reuses (HF's `kv_sharing_modes`): the last earlier layer of its
    type that stores them; None where a layer computes its own."""
    modes = text.kv_sharing_modes
    if "reuse" not in modes:
        return None
    stores = {text.layer_types[i]: i for i, mode in enumerate(modes) if mode != "reuse"}  # last one of each type
    return [stores[text.layer_types[i]] if mode == "reuse" else None for i, mode in enumerate(modes)]


def layer_attribute(text: Any, layer: int, name: str) -> Any:
    """`name` of one layer: from HF's `per_layer_config` where the config varies by layer (Gemma 4)."""
    per_layer = getattr(text, "per_layer_config", None)
    return getattr(per_layer[layer] if per_layer is not None else text, name)


def gemma_ple_config(text: Any, architecture: str) -> dict:
    """The fields Gemma 3n and Gemma 4 share: norms, attention, sliding layers, per-layer inputs."""
    is_sliding = [kind == "sliding_attention" for kind in text.layer_types]
    d_ple = text.hidden_size_per_layer_input or None
    return dict(
        d_model=text.hidden_size,
        d_head=layer_attribute(text, 0, "head_dim"),  # the model's; Gemma 4's global layers differ (layer_d_head)
        n_heads=text.num_attention_heads,
        n_key_value_heads=layer_attribute(text, 0, "num_key_value_heads"),
        n_layers=text.num_hidden_layers,
        n_ctx=text.max_position_embeddings,
        d_vocab=text.vocab_size,
        act_fn=require_activation(text, "hidden_activation"),
        gated_mlp=True,
        eps=text.rms_norm_eps,
        normalization_type="RMS",
        norm_gain_in_fp32=True,  # float32 normalized input times `w`, then the cast
        use_normalization_before_and_after=True,
        use_qk_norm=True,
        use_v_norm=True,
        attn_scale=1.0,  # HF's scaling 1.0: the q/k-norms set the scale
        positional_embedding_type="rotary",
        **per_layer_type_rope(text),
        **local_attention(text.sliding_window, is_sliding),
        kv_shared_from=kv_shared_from(text),
        output_logits_soft_cap=float(text.final_logit_softcapping or -1.0),
        embed_scale=text.hidden_size**0.5,
        d_per_layer_input=d_ple,
        d_vocab_per_layer_input=text.vocab_size_per_layer_input if d_ple else None,
        default_prepend_bos=True,
        original_architecture=architecture,
    )


def _check_gemma4(text: Any) -> None:
    require_supported(text, "Gemma 4", "enable_moe_block", (False,), default=False)
    require_supported(text, "Gemma 4", "use_bidirectional_attention", (None,))
    for layer_type in sorted(set(text.layer_types)):
        require_rope_types(text, "Gemma 4", ROPE_TYPES, layer_type=layer_type)


def convert_gemma4_config(hf: Any) -> dict:
    text = text_config(hf)
    _check_gemma4(text)
    fields = gemma_ple_config(text, "Gemma4ForCausalLM")
    layers = range(text.num_hidden_layers)
    wide = [2 if text.use_double_wide_mlp and mode == "reuse" else 1 for mode in text.kv_sharing_modes]
    return dict(
        fields,
        d_mlp=text.intermediate_size,
        layer_d_head=[layer_attribute(text, i, "head_dim") for i in layers],
        layer_n_key_value_heads=[layer_attribute(text, i, "num_key_value_heads") for i in layers],
        layer_d_mlp=[text.intermediate_size * w for w in wide],
        layer_scalar=True,
    )


# -- weights ----------------------------------------------------------------------------


def decoder_prefix(hf_state: Mapping[str, torch.Tensor]) -> str:
    for prefix in _DECODER_PREFIXES:
        if prefix + "embed_tokens.weight" in hf_state:
            return prefix
    return ""


def ple_attention_weights(hf: Mapping[str, torch.Tensor], p: str, cfg, shared: bool) -> dict[str, torch.Tensor]:
    """`attn.*` of one Gemma 3n/4 layer (`cfg` its layer config): no K/V where it reuses another layer's; values
    are the keys' projection where a layer has no `v_proj` (Gemma 4's `attention_k_eq_v`)."""
    H, Hkv, dh = cfg.n_heads, cfg.n_kv_heads, cfg.d_head
    kv = "_" if cfg.uses_grouped_query_attention else ""
    zeros = lambda n: torch.zeros(n, dh, dtype=hf[p + "q_proj.weight"].dtype)  # noqa: E731
    out = {
        "attn.W_Q": heads_in(hf[p + "q_proj.weight"], H, dh),  # [head, d_model, d_head]
        "attn.b_Q": _bias(hf, p + "q_proj.bias", H, dh, zeros),
        "attn.W_O": heads_out(hf[p + "o_proj.weight"], H, dh),  # [head, d_head, d_model]
        "attn.b_O": hf.get(p + "o_proj.bias", torch.zeros(cfg.d_model)),
        "attn.q_norm.w": hf[p + "q_norm.weight"],  # [d_head]
    }
    if shared:
        return out
    v_proj = p + ("v_proj" if p + "v_proj.weight" in hf else "k_proj")  # k_eq_v: the values are the keys' projection
    out[f"attn.{kv}W_K"] = heads_in(hf[p + "k_proj.weight"], Hkv, dh)  # [kv_head, d_model, d_head]
    out[f"attn.{kv}b_K"] = _bias(hf, p + "k_proj.bias", Hkv, dh, zeros)
    out[f"attn.{kv}W_V"] = heads_in(hf[v_proj + ".weight"], Hkv, dh)
    out[f"attn.{kv}b_V"] = _bias(hf, v_proj + ".bias", Hkv, dh, zeros)
    out["attn.k_norm.w"] = hf[p + "k_norm.weight"]
    return out


def _bias(hf: Mapping[str, torch.Tensor], key: str, heads: int, d_head: int, zeros) -> torch.Tensor:
    return hf[key].reshape(heads, d_head) if key in hf else zeros(heads)  # [heads, d_head]


def block_norms_and_mlp(hf: Mapping[str, torch.Tensor], p: str, cfg) -> dict[str, torch.Tensor]:
    """The sandwich norms (gains `w`, as HF stores them), the MLP and the per-layer input of one layer."""
    norms = {
        "ln1": "input_layernorm",
        "ln1_post": "post_attention_layernorm",
        "ln2": "pre_feedforward_layernorm",
        "ln2_post": "post_feedforward_layernorm",
    }
    out = {f"{ours}.w": hf[p + f"{theirs}.weight"] for ours, theirs in norms.items()}
    out.update(gated_mlp_weights(hf, p + "mlp.", cfg))
    if cfg.d_per_layer_input:
        out["per_layer.W_gate"] = hf[p + "per_layer_input_gate.weight"].T  # [d_model, d_ple]
        out["per_layer.W_proj"] = hf[p + "per_layer_projection.weight"].T  # [d_ple, d_model]
        out["per_layer.ln.w"] = hf[p + "post_per_layer_input_norm.weight"]
    return out


def per_layer_embed_weights(hf: Mapping[str, torch.Tensor], cfg) -> dict[str, torch.Tensor]:
    """The model-level per-layer embedding: its table (scaled by sqrt(d_ple), as HF in the model dtype), the
    projection of the embedding and its norm."""
    if not cfg.d_per_layer_input:
        return {}
    return {
        "per_layer_embed.W_E": scaled_embedding(
            hf["embed_tokens_per_layer.weight"], cfg.d_per_layer_input**0.5, cfg.dtype
        ),  # [d_vocab_ple, n_layers * d_ple]
        "per_layer_embed.W_proj": hf["per_layer_model_projection.weight"].T,  # [d_model, n_layers * d_ple]
        "per_layer_embed.ln.w": hf["per_layer_projection_norm.weight"],  # [d_ple]
    }


def convert_gemma4_weights(hf_state: Mapping[str, torch.Tensor], cfg) -> dict[str, torch.Tensor]:
    hf = strip_prefix(hf_state, decoder_prefix(hf_state))
    embed = hf["embed_tokens.weight"]  # [d_vocab, d_model]
    sd = {"embed.W_E": scaled_embedding(embed, cfg.embed_scale, cfg.dtype), **per_layer_embed_weights(hf, cfg)}
    for layer in range(cfg.n_layers):
        p, layer_cfg = f"layers.{layer}.", cfg.layer_config(layer)
        block = ple_attention_weights(hf, p + "self_attn.", layer_cfg, cfg.kv_source(layer) is not None)
        block.update(block_norms_and_mlp(hf, p, layer_cfg))
        if cfg.layer_scalar:
            block["layer_scalar"] = hf[p + "layer_scalar"]  # [1]
        sd.update({f"blocks.{layer}.{k}": v for k, v in block.items()})
    sd["ln_final.w"] = hf["norm.weight"]
    lm_head = hf_state.get("lm_head.weight", hf_state.get("language_model.lm_head.weight"))
    sd.update(unembed_weights(lm_head, embed))  # tied: W_U is the unscaled embedding
    return sd


register_architecture(
    ("Gemma4ForCausalLM", "Gemma4ForConditionalGeneration"), convert_gemma4_config, convert_gemma4_weights
)
