"""CodeGen (`CodeGenForCausalLM`): GPT-J's layout with q, k and v fused in four model-parallel blocks.

    per layer:  n = ln_1(x);  x + attn(n) + mlp(n)          (parallel block, one shared LayerNorm)
    logits = lm_head(ln_f(x))                               (lm_head has a bias: b_U)

`qkv_proj` was trained sharded over `mp_num = 4` devices, and HF keeps that layout: the output
rows are `[mp, (q, v, k), d_model / mp]` (values before keys), each shard holding a contiguous
quarter of every projection's features. Rotary is GPT-J's: adjacent pairs `(2i, 2i+1)` of the
first `rotary_dim` dims, base 10000, applied in float32 with a float32 table (then cast back), and
the scores are computed from float32 q and k.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from jaxtyping import Float

from hooked.loading.common import strip_prefix, unembed_weights
from hooked.loading.config_checks import require_supported
from hooked.loading.gptj import convert_gptj_config
from hooked.loading.parts import attention, dense_mlp, layer_norm, prefixed, shared_layer_norm
from hooked.loading.registry import register_architecture

#: HF's CodeGen hard-codes the four shards of the fused projection
MP_NUM = 4


def convert_codegen_config(hf: Any) -> dict:
    """GPT-J's config (CodeGen's blocks are GPT-J's), with the rotary in float32 and no BOS prepended."""
    require_supported(hf, "CodeGen", "n_embd", lambda d: d % MP_NUM == 0, describe="n_embd divisible by mp_num = 4")
    return dict(
        convert_gptj_config(hf),
        rotary_in_fp32=True,  # HF rotates with its float32 sin/cos table, then casts q and k back
        rotary_tables_in_fp32=True,
        default_prepend_bos=False,
        original_architecture="CodeGenForCausalLM",
    )


def split_mp_qkv(
    fused: Float[torch.Tensor, "three_d d_model"], d_model: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`qkv_proj.weight` `[mp * (q, v, k) * d_model/mp, d_model]` -> q, k, v each `[d_model, d_model]`."""
    local = d_model // MP_NUM
    shards = fused.reshape(MP_NUM, 3, local, fused.shape[-1])  # [mp, (q, v, k), local, d_model]
    q, v, k = (shards[:, i].reshape(d_model, fused.shape[-1]) for i in range(3))  # features in shard order
    return q, k, v


def convert_codegen_weights(hf_state: Mapping[str, torch.Tensor], cfg) -> dict[str, torch.Tensor]:
    hf = strip_prefix(hf_state, "transformer.")
    d = cfg.d_model
    sd = {"embed.W_E": hf["wte.weight"]}  # [d_vocab, d_model]
    for layer in range(cfg.n_layers):
        p = f"h.{layer}."
        q, k, v = split_mp_qkv(hf[p + "attn.qkv_proj.weight"], d)
        block = {
            **shared_layer_norm(hf, p + "ln_1", d),
            **attention(q, k, v, hf[p + "attn.out_proj.weight"], (None, None, None, None), cfg),
            **dense_mlp(hf, p + "mlp.fc_in", p + "mlp.fc_out"),
        }
        sd.update(prefixed(f"blocks.{layer}.", block))
    sd.update(layer_norm(hf, "ln_f", "ln_final", d))
    sd.update(unembed_weights(hf.get("lm_head.weight"), sd["embed.W_E"], hf.get("lm_head.bias")))
    return sd


register_architecture(("CodeGenForCausalLM",), convert_codegen_config, convert_codegen_weights)
