"""LLaMA-shaped decoders: Llama 1/2/3, Mistral, Qwen2 and Qwen3.

The four HF classes share one layout, so one weight converter serves them all:

    x = embed_tokens(tokens)
    per layer:  n = input_layernorm(x)
                x += o_proj(attention(rotary(q_proj(n)), rotary(k_proj(n)), v_proj(n)))
                n = post_attention_layernorm(x)
                x += down_proj(silu(gate_proj(n)) * up_proj(n))
    logits = lm_head(norm(x))

RMSNorm everywhere, NeoX half-split rotary over the whole head (HF's rope for these
classes never rotates part of a head: 5.x ignores `partial_rotary_factor` for the
default rope, so we do too), and grouped-query
attention whenever `num_key_value_heads < num_attention_heads`. The families differ
only in small config facts:

| family  | q/k/v biases              | qk-norm          | sliding window                                   | BOS |
|---------|---------------------------|------------------|--------------------------------------------------|-----|
| Llama   | `attention_bias` (+o)     | no               | none                                             | yes |
| Mistral | none                      | no               | `sliding_window` on every layer                  | yes |
| Qwen2   | always q/k/v, never o     | no               | `use_sliding_window`: the `layer_types` layers   | no  |
| Qwen3   | `attention_bias` (+o)     | per-head RMSNorm | as Qwen2                                         | no  |

Biases need no config: the weight converter takes whatever biases the checkpoint has
(including Llama's `mlp_bias`) and fills the rest with zeros.

HF `nn.Linear` weights are `[out, in]` (they left-multiply); TransformerLens weights
right-multiply, so every matrix is transposed, as a view, on the way in.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from hooked.loading.common import (  # noqa: F401  (ACT_FN_NAMES: importable from here before)
    ACT_FN_NAMES,
    bias_or_zeros,
    heads_in,
    heads_out,
    per_layer_type_rope,
    strip_prefix,
    unembed_weights,
)
from hooked.loading.config_checks import require_activation
from hooked.loading.registry import register_architecture

# -- config -----------------------------------------------------------------------------


def llama_shaped_config(hf: Any, architecture: str, extra_activations: tuple[str, ...] = ()) -> dict:
    """The `HookedTransformerConfig` fields common to every LLaMA-shaped family (`extra_activations`: the activations
    beyond the common ones that the caller loads, as Apertus's trainable `xielu`)."""
    d_head = getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads
    return dict(
        d_model=hf.hidden_size,
        d_head=d_head,
        n_heads=hf.num_attention_heads,
        n_key_value_heads=getattr(hf, "num_key_value_heads", None) or hf.num_attention_heads,
        n_layers=hf.num_hidden_layers,
        n_ctx=hf.max_position_embeddings,
        d_mlp=hf.intermediate_size,
        d_vocab=hf.vocab_size,
        act_fn=require_activation(hf, "hidden_act", extra=extra_activations),
        gated_mlp=True,
        eps=getattr(hf, "rms_norm_eps", 1e-5),  # OLMo-1 has no norm eps (its LayerNorm uses 1e-5)
        normalization_type="RMS",
        positional_embedding_type="rotary",
        rotary_dim=d_head,
        rotary_adjacent_pairs=False,
        **per_layer_type_rope(hf),  # rotary_base/rotary_scaling (+ the local ones if given per layer type)
        original_architecture=architecture,
    )


def local_attention(window: int | None, is_local: list[bool]) -> dict:
    """Config fields for sliding-window layers: query i sees keys j with `i - window < j <= i`."""
    if window is None or not any(is_local):
        return {}
    return dict(use_local_attn=True, window_size=window, attn_types=["local" if x else "global" for x in is_local])


def qwen_local_layers(hf: Any) -> list[bool]:
    """Which Qwen2/Qwen3 layers slide: HF 5's `layer_types`, else layers from `max_window_layers` on."""
    layer_types = getattr(hf, "layer_types", None)
    if layer_types is None:
        return [layer >= hf.max_window_layers for layer in range(hf.num_hidden_layers)]
    return [kind == "sliding_attention" for kind in layer_types]


def convert_llama_config(hf: Any) -> dict:
    return dict(llama_shaped_config(hf, "LlamaForCausalLM"), default_prepend_bos=True)


def convert_mistral_config(hf: Any) -> dict:
    window = getattr(hf, "sliding_window", None)
    return dict(
        llama_shaped_config(hf, "MistralForCausalLM"),
        **local_attention(window, [True] * hf.num_hidden_layers),
        default_prepend_bos=True,
    )


def _qwen_config(hf: Any, architecture: str, use_qk_norm: bool) -> dict:
    # transformers 5 already sets `sliding_window` to None unless `use_sliding_window`; 4.x does not.
    window = hf.sliding_window if getattr(hf, "use_sliding_window", False) else None
    return dict(
        llama_shaped_config(hf, architecture),
        **local_attention(window, qwen_local_layers(hf)),
        use_qk_norm=use_qk_norm,
        default_prepend_bos=False,
    )


def convert_qwen2_config(hf: Any) -> dict:
    return _qwen_config(hf, "Qwen2ForCausalLM", use_qk_norm=False)


def convert_qwen3_config(hf: Any) -> dict:
    return _qwen_config(hf, "Qwen3ForCausalLM", use_qk_norm=True)


# -- weights ----------------------------------------------------------------------------


def convert_llama_weights(hf_state: Mapping[str, torch.Tensor], cfg) -> dict[str, torch.Tensor]:
    """HF LLaMA-shaped state dict (`model.layers.{l}...`) -> TransformerLens names and shapes (views)."""
    hf = strip_prefix(hf_state, "model.")
    sd = {"embed.W_E": hf["embed_tokens.weight"]}  # [d_vocab, d_model]
    for layer in range(cfg.n_layers):
        p, b = f"layers.{layer}.", f"blocks.{layer}."
        if cfg.normalization_type == "RMS":  # parameter-free norms (OLMo-1's LayerNorm) have no weights
            sd[b + "ln1.w"] = hf[p + "input_layernorm.weight"]
            sd[b + "ln2.w"] = hf[p + "post_attention_layernorm.weight"]
        sd.update({b + k: v for k, v in attention_weights(hf, p + "self_attn.", cfg).items()})
        sd.update({b + k: v for k, v in gated_mlp_weights(hf, p + "mlp.", cfg).items()})
    if cfg.normalization_type == "RMS":
        sd["ln_final.w"] = hf["norm.weight"]
    sd.update(unembed_weights(hf.get("lm_head.weight"), sd["embed.W_E"]))
    return sd


def attention_weights(hf: Mapping[str, torch.Tensor], p: str, cfg) -> dict[str, torch.Tensor]:
    """`q_proj`/`k_proj`/`v_proj`/`o_proj` (and `q_norm`/`k_norm`) -> `attn.*` per-head tensors.

    Grouped-query models store K and V at `n_key_value_heads` under `_W_K`, `_b_K`, ...;
    the `W_K` properties of `GroupedQueryAttention` repeat them up to `n_heads`.
    """
    H, Hkv, dh, d = cfg.n_heads, cfg.n_kv_heads, cfg.d_head, cfg.d_model
    kv = "_" if cfg.uses_grouped_query_attention else ""
    out = {}
    for name, proj, heads, prefix in (("Q", "q_proj", H, ""), ("K", "k_proj", Hkv, kv), ("V", "v_proj", Hkv, kv)):
        w = hf[p + f"{proj}.weight"]  # [heads * d_head, d_model]
        out[f"attn.{prefix}W_{name}"] = heads_in(w, heads, dh)  # [heads, d_model, d_head]
        bias = bias_or_zeros(hf, p + f"{proj}.bias", heads * dh, w)  # [heads * d_head]
        out[f"attn.{prefix}b_{name}"] = bias.reshape(heads, dh)  # [heads, d_head]
    w_o = hf[p + "o_proj.weight"]  # [d_model, head * d_head]
    out["attn.W_O"] = heads_out(w_o, H, dh)  # [head, d_head, d_model]
    out["attn.b_O"] = bias_or_zeros(hf, p + "o_proj.bias", d, w_o)  # [d_model]
    if cfg.use_qk_norm:
        out["attn.q_norm.w"] = hf[p + "q_norm.weight"]  # [d_head], shared by all heads
        out["attn.k_norm.w"] = hf[p + "k_norm.weight"]  # [d_head]
    return out


def gated_mlp_weights(hf: Mapping[str, torch.Tensor], p: str, cfg) -> dict[str, torch.Tensor]:
    """SwiGLU `down(act(gate(x)) * up(x))` -> `mlp.W_gate`, `mlp.W_in` (up), `mlp.W_out` (down)."""
    out = {}
    layers = (("gate", "gate_proj", cfg.d_mlp), ("in", "up_proj", cfg.d_mlp), ("out", "down_proj", cfg.d_model))
    for name, proj, size in layers:
        w = hf[p + f"{proj}.weight"]  # [d_out, d_in]
        out[f"mlp.W_{name}"] = w.T  # [d_in, d_out]
        out[f"mlp.b_{name}"] = bias_or_zeros(hf, p + f"{proj}.bias", size, w)  # [d_out]
    return out


register_architecture(("LlamaForCausalLM",), convert_llama_config, convert_llama_weights)
register_architecture(("MistralForCausalLM",), convert_mistral_config, convert_llama_weights)
register_architecture(("Qwen2ForCausalLM",), convert_qwen2_config, convert_llama_weights)
register_architecture(("Qwen3ForCausalLM",), convert_qwen3_config, convert_llama_weights)
