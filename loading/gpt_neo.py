"""GPT-Neo (`GPTNeoForCausalLM`, also TinyStories): learned positions, no 1/sqrt(d_head) scaling,
alternating global and local (sliding-window) attention layers.

    x = wte(tokens) + wpe(positions)
    per layer:  x += attn(ln_1(x));  x += mlp(ln_2(x))
    logits = wte^T ln_f(x)             (tied)

`attention_types` expands to one "global"/"local" per layer; a local query i sees keys j with
`i - window_size < j <= i`. q/k/v have no bias, `out_proj` and the MLP do.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from hooked.loading.common import ACT_FN_NAMES, strip_prefix, unembed_weights  # noqa: F401  (ACT_FN_NAMES: importable from here before)
from hooked.loading.config_checks import require_activation
from hooked.loading.parts import dense_mlp, layer_norm, prefixed, projections
from hooked.loading.registry import register_architecture


def convert_gpt_neo_config(hf: Any) -> dict:
    layers = list(hf.attention_layers)  # one "global"/"local" per layer
    local = dict(use_local_attn=True, window_size=hf.window_size, attn_types=layers) if "local" in layers else {}
    return dict(
        d_model=hf.hidden_size,
        d_head=hf.hidden_size // hf.num_heads,
        n_heads=hf.num_heads,
        n_layers=hf.num_layers,
        n_ctx=hf.max_position_embeddings,
        d_mlp=hf.intermediate_size or 4 * hf.hidden_size,
        d_vocab=hf.vocab_size,
        act_fn=require_activation(hf, "activation_function"),
        eps=hf.layer_norm_epsilon,
        normalization_type="LN",
        positional_embedding_type="standard",
        use_attn_scale=False,
        **local,
        default_prepend_bos=True,
        attn_scores_in_fp32=True,  # HF: matmul(q.float(), k.float()) in every dtype
        original_architecture="GPTNeoForCausalLM",
    )


def convert_gpt_neo_weights(hf_state: Mapping[str, torch.Tensor], cfg) -> dict[str, torch.Tensor]:
    hf = strip_prefix(hf_state, "transformer.")
    d = cfg.d_model
    sd = {"embed.W_E": hf["wte.weight"], "pos_embed.W_pos": hf["wpe.weight"]}
    for layer in range(cfg.n_layers):
        p = f"h.{layer}."
        block = {
            **layer_norm(hf, p + "ln_1", "ln1", d),
            **projections(hf, p + "attn.attention.", ("q_proj", "k_proj", "v_proj", "out_proj"), cfg),
            **layer_norm(hf, p + "ln_2", "ln2", d),
            **dense_mlp(hf, p + "mlp.c_fc", p + "mlp.c_proj"),
        }
        sd.update(prefixed(f"blocks.{layer}.", block))
    sd.update(layer_norm(hf, "ln_f", "ln_final", d))
    sd.update(unembed_weights(hf.get("lm_head.weight"), sd["embed.W_E"]))
    return sd


register_architecture(("GPTNeoForCausalLM",), convert_gpt_neo_config, convert_gpt_neo_weights)
