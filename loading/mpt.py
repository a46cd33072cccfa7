"""MPT (`MptForCausalLM`): ALiBi, no biases anywhere, q/k/v clipped, fused `Wqkv`.

    x = wte(tokens)
    per layer:  x += out_proj(attention(clip(Wqkv(norm_1(x)))));  x += down(gelu(up(norm_2(x))))
    logits = wte^T norm_f(x)                                    (tied)

The LayerNorms have a gain and no bias (`no_bias`), and so does every Linear. `Wqkv` rows are
`[Q; K; V]` blocks; `clip_qkv` clamps all three after the projection. ALiBi is MPT's own
(`cfg.alibi_bias_max`, see `components/alibi.py`): HF builds it with `alibi_bias_max = 8` whatever
the config says, and hard-codes the MLP width `4 * d_model`, so configs asking otherwise are
refused, as are the attention variants HF's MPT does not implement (multi-query, qk LayerNorm,
prefix LM, sequence ids, learned positions instead of ALiBi).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from hooked.loading.common import strip_prefix, unembed_weights
from hooked.loading.config_checks import require_supported
from hooked.loading.fused_qkv import split_qkv_blocks
from hooked.loading.parts import attention, dense_mlp, layer_norm, prefixed
from hooked.loading.registry import register_architecture

#: the `alibi_bias_max` HF's `MptModel` always builds its biases with
HF_ALIBI_BIAS_MAX = 8


def _check_mpt(hf: Any) -> Any:
    """Refuse what HF's MPT does not compute as configured; returns `attn_config`."""
    require_supported(hf, "MPT", "expansion_ratio", (4,), default=4)
    require_supported(hf, "MPT", "no_bias", (True,), default=True)
    require_supported(hf, "MPT", "logit_scale", (None, 1, 1.0))
    for field, supported in (
        ("attn_type", ("multihead_attention",)),
        ("qk_ln", (False,)),
        ("prefix_lm", (False,)),
        ("attn_uses_sequence_id", (False,)),
        ("alibi", (True,)),
        ("alibi_bias_max", (HF_ALIBI_BIAS_MAX,)),
    ):
        require_supported(hf, "MPT", f"attn_config.{field}", supported)
    return hf.attn_config


def convert_mpt_config(hf: Any) -> dict:
    attn = _check_mpt(hf)
    d_head = hf.d_model // hf.n_heads
    scale = attn.softmax_scale
    return dict(
        d_model=hf.d_model,
        d_head=d_head,
        n_heads=hf.n_heads,
        n_layers=hf.n_layers,
        n_ctx=hf.max_seq_len,
        d_mlp=4 * hf.d_model,
        d_vocab=hf.vocab_size,
        act_fn="gelu",
        eps=hf.layer_norm_epsilon,
        normalization_type="LN",
        positional_embedding_type="alibi",
        alibi_bias_max=float(HF_ALIBI_BIAS_MAX),
        attn_scale=-1.0 if scale is None else 1.0 / scale,
        clip_qkv=attn.clip_qkv or None,
        default_prepend_bos=False,
        original_architecture="MptForCausalLM",
    )


def convert_mpt_weights(hf_state: Mapping[str, torch.Tensor], cfg) -> dict[str, torch.Tensor]:
    hf = strip_prefix(hf_state, "transformer.")
    H, dh, d = cfg.n_heads, cfg.d_head, cfg.d_model
    sd = {"embed.W_E": hf["wte.weight"]}  # [d_vocab, d_model]
    for layer in range(cfg.n_layers):
        p = f"blocks.{layer}."
        qkv = split_qkv_blocks(hf[p + "attn.Wqkv.weight"], H, H, dh)  # 3 x [head * d_head, d_model]
        block = {
            **layer_norm(hf, p + "norm_1", "ln1", d),
            **attention(*qkv, hf[p + "attn.out_proj.weight"], (None, None, None, None), cfg),
            **layer_norm(hf, p + "norm_2", "ln2", d),
            **dense_mlp(hf, p + "ffn.up_proj", p + "ffn.down_proj"),
        }
        sd.update(prefixed(p, block))
    sd.update(layer_norm(hf, "norm_f", "ln_final", d))
    sd.update(unembed_weights(hf.get("lm_head.weight"), sd["embed.W_E"]))
    return sd


register_architecture(("MptForCausalLM",), convert_mpt_config, convert_mpt_weights)
