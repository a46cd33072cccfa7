"""LFM2 (`Lfm2ForCausalLM`) and LFM2-MoE (`Lfm2MoeForCausalLM`): gated short convolutions with grouped-query
attention every few layers.

    x = embed_tokens(tokens)
    per layer:  x += conv(operator_norm(x))          (`conv`: components/short_conv.py)
             or x += self_attn(operator_norm(x))     (`full_attention`: per-head qk RMSNorm, rotary)
                x += feed_forward(ffn_norm(x))       (SwiGLU: w2(silu(w1 x) * w3 x))
    logits = lm_head(embedding_norm(x))              (tied by default)

RMSNorm cast before its gain (as LLaMA). The MLP width is HF's: with `block_auto_adjust_ff_dim`,
`2/3` of `intermediate_size`, times `block_ffn_dim_multiplier`, rounded up to `block_multiple_of`.
LFM2-MoE keeps a dense SwiGLU (`intermediate_size`) in its first `num_dense_layers` layers
(`dense_mlp_layers`); the others are mixtures of experts routed by a sigmoid per expert in the model
dtype, chosen on the scores plus `expert_bias` (loaded as the router's selection bias
`mlp.e_score_correction_bias`, zeros without `use_expert_bias`), renormalized with HF's `+ 1e-6`
(`router_norm_eps`) and scaled by `routed_scaling_factor`: DeepSeek-V3's router without groups
(`components/moe_routing.py`, `GroupLimitedMoE`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from hooked.core.validation import require_set
from hooked.loading.common import hf_rope_parameters, strip_prefix, unembed_weights
from hooked.loading.config_checks import require_rope_types, require_supported
from hooked.loading.llama import attention_weights
from hooked.loading.mamba import conv_weights, linear_weights
from hooked.loading.moe import MIXTRAL_EXPERT_NAMES, expert_weights
from hooked.loading.registry import register_architecture

LAYER_TYPES = {"conv": "short_conv", "full_attention": "attention"}


def lfm2_mlp_width(hf: Any, width: int) -> int:
    """HF's `Lfm2MLP` width: `width`, or with `block_auto_adjust_ff_dim` 2/3 of it, scaled and rounded up."""
    if not hf.block_auto_adjust_ff_dim:
        return width
    width = int(2 * width / 3)
    if hf.block_ffn_dim_multiplier is not None:
        width = int(hf.block_ffn_dim_multiplier * width)
        width = hf.block_multiple_of * ((width + hf.block_multiple_of - 1) // hf.block_multiple_of)
    return width


def lfm2_config(hf: Any, architecture: str) -> dict:
    require_rope_types(hf, architecture, ("default",))
    require_supported(
        hf,
        architecture,
        "layer_types",
        lambda v: v is not None and set(v) <= set(LAYER_TYPES),
        describe=str(LAYER_TYPES),
    )
    base, _ = hf_rope_parameters(hf)
    d_head = hf.hidden_size // hf.num_attention_heads
    return dict(
        d_model=hf.hidden_size,
        d_head=d_head,
        n_heads=hf.num_attention_heads,
        n_key_value_heads=hf.num_key_value_heads,
        n_layers=hf.num_hidden_layers,
        n_ctx=hf.max_position_embeddings,
        d_vocab=hf.vocab_size,
        act_fn="silu",
        gated_mlp=True,
        eps=hf.norm_eps,
        normalization_type="RMS",
        use_qk_norm=True,
        positional_embedding_type="rotary",
        rotary_dim=d_head,
        rotary_base=base,
        layer_types=[LAYER_TYPES[kind] for kind in hf.layer_types],
        ssm_conv_kernel=hf.conv_L_cache,
        original_architecture=architecture,
        default_prepend_bos=True,
    )


def convert_lfm2_config(hf: Any) -> dict:
    return dict(lfm2_config(hf, "Lfm2ForCausalLM"), d_mlp=lfm2_mlp_width(hf, hf.intermediate_size))


def lfm2_attention_weights(hf: Mapping[str, torch.Tensor], p: str, cfg) -> dict[str, torch.Tensor]:
    """LFM2's `self_attn` (`out_proj`, `q_layernorm`, `k_layernorm`) under LLaMA's names -> `attn.*`."""
    renamed = {"o_proj": "out_proj", "q_norm": "q_layernorm", "k_norm": "k_layernorm"}

    class Renamed(Mapping):
        def __getitem__(self, key: str) -> torch.Tensor:
            for ours, theirs in renamed.items():
                key = key.replace(p + ours + ".", p + theirs + ".")
            return hf[key]

        def __contains__(self, key) -> bool:
            try:
                self[key]
            except KeyError:
                return False
            return True

        def __iter__(self):
            return iter(hf)

        def __len__(self) -> int:
            return len(hf)

    return attention_weights(Renamed(), p, cfg)


def swiglu_weights(hf: Mapping[str, torch.Tensor], p: str) -> dict[str, torch.Tensor]:
    """`w1` (gate), `w3` (up), `w2` (down) -> `mlp.W_gate`, `mlp.W_in`, `mlp.W_out` (and zero biases)."""
    out = {}
    for ours, theirs in (("gate", "w1"), ("in", "w3"), ("out", "w2")):
        out.update({f"mlp.{k}": v for k, v in linear_weights(hf, p + theirs, ours).items()})
    return out


def make_lfm2_weights(mlp_weights):
    def convert(hf_state: Mapping[str, torch.Tensor], cfg) -> dict[str, torch.Tensor]:
        """HF LFM2 state dict (`model.layers.{l}...`) -> TransformerLens-style names (views)."""
        hf = strip_prefix(hf_state, "model.")
        sd = {"embed.W_E": hf["embed_tokens.weight"]}  # [d_vocab, d_model]
        for layer, kind in enumerate(cfg.mixer_types):
            p, b = f"layers.{layer}.", f"blocks.{layer}."
            sd[b + "ln1.w"], sd[b + "ln2.w"] = hf[p + "operator_norm.weight"], hf[p + "ffn_norm.weight"]
            if kind == "attention":
                sd.update({b + k: v for k, v in lfm2_attention_weights(hf, p + "self_attn.", cfg).items()})
            else:
                mixer = {
                    **linear_weights(hf, p + "conv.in_proj", "in"),
                    **linear_weights(hf, p + "conv.out_proj", "out"),
                }
                mixer.update(conv_weights(hf, p + "conv.conv"))
                sd.update({b + "mixer." + k: v for k, v in mixer.items()})
            sd.update({b + k: v for k, v in mlp_weights(hf, p + "feed_forward.", cfg, layer).items()})
        sd["ln_final.w"] = hf["embedding_norm.weight"]
        sd.update(unembed_weights(hf_state.get("lm_head.weight"), sd["embed.W_E"]))
        return sd

    return convert


def convert_lfm2_moe_config(hf: Any) -> dict:
    dense = list(range(hf.num_dense_layers))
    widths = [hf.intermediate_size if i in dense else hf.moe_intermediate_size for i in range(hf.num_hidden_layers)]
    return dict(
        lfm2_config(hf, "Lfm2MoeForCausalLM"),
        d_mlp=hf.moe_intermediate_size,
        num_experts=hf.num_experts,
        experts_per_token=hf.num_experts_per_tok,
        norm_topk_prob=hf.norm_topk_prob,
        router_scoring="sigmoid",
        router_norm_eps=1e-6,  # HF's Lfm2MoeTopKRouter (DeepSeek's adds 1e-20)
        routed_scaling_factor=float(hf.routed_scaling_factor),
        dense_mlp_layers=dense or None,
        layer_d_mlp=widths if dense else None,  # the dense layers' width; an expert's is d_mlp
    )


def lfm2_moe_mlp_weights(hf: Mapping[str, torch.Tensor], p: str, cfg, layer: int) -> dict[str, torch.Tensor]:
    """A dense layer's SwiGLU, or the router (`gate`), fused experts and `expert_bias` -> `mlp.*`.

    `expert_bias` becomes the sigmoid router's selection bias `mlp.e_score_correction_bias` (zeros when the
    model has none, `use_expert_bias=False`: adding 0 to the scores changes no choice)."""
    if not cfg.is_moe_layer(layer):
        return swiglu_weights(hf, p)
    out = {"mlp." + k: v for k, v in expert_weights(hf, p, cfg, MIXTRAL_EXPERT_NAMES).items()}  # w1, w3, w2
    bias = hf.get(p + "expert_bias")  # [num_experts], float32
    zeros = torch.zeros(require_set(cfg.num_experts, "num_experts"))
    out["mlp.e_score_correction_bias"] = zeros if bias is None else bias
    return out


register_architecture(
    ("Lfm2ForCausalLM",), convert_lfm2_config, make_lfm2_weights(lambda hf, p, cfg, layer: swiglu_weights(hf, p))
)
register_architecture(("Lfm2MoeForCausalLM",), convert_lfm2_moe_config, make_lfm2_weights(lfm2_moe_mlp_weights))
