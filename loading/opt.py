"""OPT (`OPTForCausalLM`), pre-LayerNorm sizes: learned positions stored with an offset of 2, relu MLP.

    x = embed_tokens(tokens) + embed_positions(positions + 2)
    per layer:  x += attn(self_attn_layer_norm(x));  x += fc2(relu(fc1(final_layer_norm(x))))
    logits = embed_tokens^T final_layer_norm(x)     (tied)

`W_pos` is `embed_positions.weight[2:]` (HF sends padding to row 1; hooked zeroes padding's
position embedding instead, which no real token sees). HF multiplies q by 1/sqrt(d_head) before
QK^T; hooked scales the scores, the same product. opt-350m is post-LN with a 512 <-> 1024
`project_in`/`project_out`: refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from hooked.loading.common import ACT_FN_NAMES, strip_prefix, unembed_weights  # noqa: F401  (ACT_FN_NAMES: importable from here before)
from hooked.loading.config_checks import require_activation, require_supported
from hooked.loading.parts import dense_mlp, layer_norm, prefixed, projections
from hooked.loading.registry import register_architecture

POSITION_OFFSET = 2


def convert_opt_config(hf: Any) -> dict:
    pre_ln = "the pre-LayerNorm OPT sizes (opt-125m, opt-1.3b, ...); post-LayerNorm ones such as opt-350m are not"
    require_supported(hf, "OPT", "do_layer_norm_before", (True,), describe=pre_ln)
    require_supported(hf, "OPT", "_remove_final_layer_norm", (False,), default=False, describe=pre_ln)
    require_supported(
        hf,
        "OPT",
        "word_embed_proj_dim",
        lambda dim: dim in (None, hf.hidden_size),
        describe="hidden_size (no projection)",
    )
    return dict(
        d_model=hf.hidden_size,
        d_head=hf.hidden_size // hf.num_attention_heads,
        n_heads=hf.num_attention_heads,
        n_layers=hf.num_hidden_layers,
        n_ctx=hf.max_position_embeddings,
        d_mlp=hf.ffn_dim,
        d_vocab=hf.vocab_size,
        act_fn=require_activation(hf, "activation_function"),
        eps=1e-5,  # nn.LayerNorm's default: OPT configs have no eps field
        normalization_type="LN",
        positional_embedding_type="standard",
        default_prepend_bos=True,
        original_architecture="OPTForCausalLM",
    )


def convert_opt_weights(hf_state: Mapping[str, torch.Tensor], cfg) -> dict[str, torch.Tensor]:
    hf = strip_prefix(hf_state, "model.decoder.")
    d = cfg.d_model
    sd = {
        "embed.W_E": hf["embed_tokens.weight"],  # [d_vocab, d_model]
        "pos_embed.W_pos": hf["embed_positions.weight"][POSITION_OFFSET:],  # [n_ctx, d_model]
    }
    for layer in range(cfg.n_layers):
        p = f"layers.{layer}."
        block = {
            **layer_norm(hf, p + "self_attn_layer_norm", "ln1", d),
            **projections(hf, p + "self_attn.", ("q_proj", "k_proj", "v_proj", "out_proj"), cfg),
            **layer_norm(hf, p + "final_layer_norm", "ln2", d),
            **dense_mlp(hf, p + "fc1", p + "fc2"),
        }
        sd.update(prefixed(f"blocks.{layer}.", block))
    sd.update(layer_norm(hf, "final_layer_norm", "ln_final", d))
    sd.update(unembed_weights(hf.get("lm_head.weight"), sd["embed.W_E"]))
    return sd


register_architecture(("OPTForCausalLM",), convert_opt_config, convert_opt_weights)
