"""GPT-J (`GPTJForCausalLM`): parallel block with one shared LayerNorm, adjacent-pair partial rotary.

    per layer:  n = ln_1(x);  x + attn(n) + mlp(n)
    logits = lm_head(ln_f(x))          (lm_head has a bias: b_U)

Rotary rotates pairs (2i, 2i+1) of the first `rotary_dim` dims (64 of 256 in GPT-J-6B), base
10000. q/k/v/out have no bias. HF computes the scores in float32 and divides by sqrt(d_head).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from hooked.loading.common import ACT_FN_NAMES, strip_prefix, unembed_weights  # noqa: F401  (ACT_FN_NAMES: importable from here before)
from hooked.loading.config_checks import require_activation
from hooked.loading.parts import dense_mlp, layer_norm, prefixed, projections, shared_layer_norm
from hooked.loading.registry import register_architecture


def convert_gptj_config(hf: Any) -> dict:
    d_head = hf.n_embd // hf.n_head
    return dict(
        d_model=hf.n_embd,
        d_head=d_head,
        n_heads=hf.n_head,
        n_layers=hf.n_layer,
        n_ctx=hf.n_positions,
        d_mlp=hf.n_inner or 4 * hf.n_embd,
        d_vocab=hf.vocab_size,
        act_fn=require_activation(hf, "activation_function"),
        eps=hf.layer_norm_epsilon,
        normalization_type="LN",
        positional_embedding_type="rotary",
        rotary_dim=hf.rotary_dim or d_head,
        rotary_adjacent_pairs=True,
        parallel_attn_mlp=True,
        parallel_residual_last=True,
        default_prepend_bos=True,
        attn_scores_in_fp32=True,  # HF: matmul(q.float(), k.float()) in every dtype
        original_architecture="GPTJForCausalLM",
    )


def convert_gptj_weights(hf_state: Mapping[str, torch.Tensor], cfg) -> dict[str, torch.Tensor]:
    hf = strip_prefix(hf_state, "transformer.")
    sd = {"embed.W_E": hf["wte.weight"]}  # [d_vocab, d_model]
    for layer in range(cfg.n_layers):
        p = f"h.{layer}."
        block = {
            **shared_layer_norm(hf, p + "ln_1", cfg.d_model),
            **projections(hf, p + "attn.", ("q_proj", "k_proj", "v_proj", "out_proj"), cfg),
            **dense_mlp(hf, p + "mlp.fc_in", p + "mlp.fc_out"),
        }
        sd.update(prefixed(f"blocks.{layer}.", block))
    sd.update(layer_norm(hf, "ln_f", "ln_final", cfg.d_model))
    sd.update(unembed_weights(hf.get("lm_head.weight"), sd["embed.W_E"], hf.get("lm_head.bias")))
    return sd


register_architecture(("GPTJForCausalLM",), convert_gptj_config, convert_gptj_weights)
