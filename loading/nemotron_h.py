"""Nemotron-H (`NemotronHForCausalLM`): Mamba-2, attention and MLP layers in a pattern, one sublayer per layer.

    x = embeddings(tokens)
    per layer:  x += mixer(norm(x))      `linear_attention`: Mamba-2 (components/mamba2.py)
                                          `full_attention`: grouped-query attention, no positions at all
                                          `mlp`: a dense MLP, up_proj -> relu2 -> down_proj
    logits = lm_head(norm_f(x))

HF's `hybrid_override_pattern` (`M` Mamba-2, `*` attention, `-` MLP, `E` MoE) becomes its
`layers_block_type`, and that list becomes `layer_types` (`single_sublayer_blocks`: an `mlp` layer is
a block with its MLP only, the others with their token mixer only). The RMSNorm multiplies its gain
in float32 before the cast. The Mamba-2 step is clamped below at `time_step_min` (HF's mixer; its
decode step does not clamp, which differs only where `softplus(dt + dt_bias)` falls below it).
MoE layers (`E`) are refused: their group-limited sigmoid router is DeepSeek-V3's (`GroupLimitedMoE`), but
their experts are non-gated relu2 MLPs, which the mixture-of-experts component (gated experts) does not build.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from hooked.loading.common import strip_prefix, unembed_weights
from hooked.loading.config_checks import require_activation, require_supported
from hooked.loading.llama import attention_weights
from hooked.loading.mamba import mamba2_mixer_weights
from hooked.loading.parts import dense_mlp
from hooked.loading.registry import register_architecture

LAYER_TYPES = {"linear_attention": "mamba2", "full_attention": "attention", "mlp": "mlp"}


def convert_nemotron_h_config(hf: Any) -> dict:
    family = "NemotronHForCausalLM"
    kinds = require_supported(
        hf, family, "layers_block_type", lambda v: set(v) <= set(LAYER_TYPES), describe=f"layer types {LAYER_TYPES}"
    )
    require_supported(hf, family, "sliding_window", (None,))
    require_supported(hf, family, "mamba_hidden_act", ("silu",))
    act_fn = require_activation(hf, "mlp_hidden_act", family, extra=("relu2",))  # relu2: HF's squared ReLU
    return dict(
        d_model=hf.hidden_size,
        d_head=hf.head_dim,
        n_heads=hf.num_attention_heads,
        n_key_value_heads=hf.num_key_value_heads,
        n_layers=len(kinds),
        n_ctx=hf.max_position_embeddings,
        d_mlp=hf.intermediate_size,
        d_vocab=hf.vocab_size,
        act_fn=act_fn,
        eps=hf.layer_norm_epsilon,
        normalization_type="RMS",
        norm_gain_in_fp32=True,  # (w * x32).to(dtype), as HF's NemotronHRMSNorm
        positional_embedding_type="rotary",
        nope_layers=list(range(len(kinds))),  # its attention has no positions
        layer_types=[LAYER_TYPES[kind] for kind in kinds],
        single_sublayer_blocks=True,
        ssm_d_state=hf.ssm_state_size,
        ssm_d_inner=hf.mamba_num_heads * hf.mamba_head_dim,
        ssm_n_heads=hf.mamba_num_heads,
        ssm_n_groups=hf.n_groups,
        ssm_conv_kernel=hf.conv_kernel,
        ssm_chunk_size=hf.chunk_size,
        ssm_dt_limit=(hf.time_step_min, None),  # HF's mixer: (time_step_min, inf)
        ssm_act_fn=hf.mamba_hidden_act,
        original_architecture=family,
        default_prepend_bos=False,
    )


def convert_nemotron_h_weights(hf_state: Mapping[str, torch.Tensor], cfg) -> dict[str, torch.Tensor]:
    """HF Nemotron-H state dict (`model.layers.{l}...`) -> TransformerLens-style names (views)."""
    prefix = "backbone." if "backbone.embeddings.weight" in hf_state else "model."  # on disk / in memory
    hf = strip_prefix(hf_state, prefix)
    sd = {"embed.W_E": hf["embeddings.weight"]}  # [d_vocab, d_model]
    for layer, kind in enumerate(cfg.mixer_types):
        p, b = f"layers.{layer}.", f"blocks.{layer}."
        sd[b + ("ln2.w" if kind == "mlp" else "ln1.w")] = hf[p + "norm.weight"]
        if kind == "mamba2":
            sd.update({b + "mixer." + k: v for k, v in mamba2_mixer_weights(hf, p + "mixer.").items()})
        elif kind == "attention":
            sd.update({b + k: v for k, v in attention_weights(hf, p + "mixer.", cfg).items()})
        else:
            sd.update({b + k: v for k, v in dense_mlp(hf, p + "mixer.up_proj", p + "mixer.down_proj").items()})
    sd["ln_final.w"] = hf["norm_f.weight"]
    sd.update(unembed_weights(hf_state.get("lm_head.weight"), sd["embed.W_E"]))
    return sd


register_architecture(("NemotronHForCausalLM",), convert_nemotron_h_config, convert_nemotron_h_weights)
