"""GPT-2 (`GPT2LMHeadModel`): learned positions, LayerNorm, fused QKV in Conv1D layout, tied embeddings.

Conv1D stores weights as `[in, out]`, already right-multiplying, so no transpose is needed.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from hooked.loading.common import ACT_FN_NAMES, strip_prefix  # noqa: F401  (ACT_FN_NAMES: importable from here before)
from hooked.loading.config_checks import require_activation
from hooked.loading.registry import register_architecture


def convert_gpt2_config(hf) -> dict:
    return dict(
        d_model=hf.n_embd,
        d_head=hf.n_embd // hf.n_head,
        n_heads=hf.n_head,
        n_layers=hf.n_layer,
        n_ctx=hf.n_positions,
        d_mlp=hf.n_inner or 4 * hf.n_embd,
        d_vocab=hf.vocab_size,
        act_fn=require_activation(hf, "activation_function"),
        eps=hf.layer_norm_epsilon,
        normalization_type="LN",
        positional_embedding_type="standard",
        use_attn_scale=hf.scale_attn_weights,
        scale_attn_by_inverse_layer_idx=hf.scale_attn_by_inverse_layer_idx,
        default_prepend_bos=True,
        original_architecture="GPT2LMHeadModel",
    )


def convert_gpt2_weights(hf_state: Mapping[str, torch.Tensor], cfg) -> dict[str, torch.Tensor]:
    """HF GPT-2 state dict -> TransformerLens names and shapes (views where possible)."""
    hf = strip_prefix(hf_state, "transformer.")
    d, H, dh = cfg.d_model, cfg.n_heads, cfg.d_head
    sd = {"embed.W_E": hf["wte.weight"], "pos_embed.W_pos": hf["wpe.weight"]}
    for layer in range(cfg.n_layers):
        p, b = f"h.{layer}.", f"blocks.{layer}."
        sd[b + "ln1.w"], sd[b + "ln1.b"] = hf[p + "ln_1.weight"], hf[p + "ln_1.bias"]
        qkv_w = hf[p + "attn.c_attn.weight"].split(d, dim=1)  # 3 x [d_model, head*d_head]
        qkv_b = hf[p + "attn.c_attn.bias"].split(d, dim=0)  # 3 x [head*d_head]
        for name, w, bias in zip("QKV", qkv_w, qkv_b, strict=True):
            sd[b + f"attn.W_{name}"] = w.reshape(d, H, dh).permute(1, 0, 2)  # [head, d_model, d_head]
            sd[b + f"attn.b_{name}"] = bias.reshape(H, dh)  # [head, d_head]
        sd[b + "attn.W_O"] = hf[p + "attn.c_proj.weight"].reshape(H, dh, d)  # [head, d_head, d_model]
        sd[b + "attn.b_O"] = hf[p + "attn.c_proj.bias"]
        sd[b + "ln2.w"], sd[b + "ln2.b"] = hf[p + "ln_2.weight"], hf[p + "ln_2.bias"]
        sd[b + "mlp.W_in"], sd[b + "mlp.b_in"] = hf[p + "mlp.c_fc.weight"], hf[p + "mlp.c_fc.bias"]
        sd[b + "mlp.W_out"], sd[b + "mlp.b_out"] = hf[p + "mlp.c_proj.weight"], hf[p + "mlp.c_proj.bias"]
    sd["ln_final.w"], sd["ln_final.b"] = hf["ln_f.weight"], hf["ln_f.bias"]
    lm_head = hf.get("lm_head.weight")
    tied = lm_head is None or lm_head.data_ptr() == sd["embed.W_E"].data_ptr()
    sd["unembed.W_U"] = sd["embed.W_E"].T if tied or lm_head is None else lm_head.T  # [d_model, d_vocab]
    sd["unembed.b_U"] = torch.zeros(sd["unembed.W_U"].shape[1], dtype=sd["embed.W_E"].dtype)
    return sd


register_architecture(("GPT2LMHeadModel",), convert_gpt2_config, convert_gpt2_weights)
