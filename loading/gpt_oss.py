"""GPT-OSS (`GptOssForCausalLM`): attention sinks, alternating sliding window, YaRN, a biased MoE.

    attention: LLaMA's with q/k/v/o biases, plus `sinks` `[heads]`: one logit per head
               appended to every softmax row and dropped after it (`cfg.attn_sinks`)
    layers:    `layer_types` alternate sliding (window 128) and full attention
    rope:      YaRN (`attention_factor` scales cos/sin)
    MLP:       router `x W^T + b`, top-k of the logits, softmax over those k (= the
               renormalized full softmax: `norm_topk_prob`); experts with biases and
               the clamped SwiGLU `(clamp(up, ±7) + 1) * g * sigmoid(1.702 g)`,
               `g = clamp(gate, max=7)` (`cfg.swiglu_limit`, `cfg.swiglu_alpha`)

transformers holds the experts as `gate_up_proj` `[E, d_model, 2*d_mlp]` with gate and up
**interleaved** on the last axis (gate = even columns) and `down_proj` `[E, d_mlp, d_model]`,
both right-multiplying; they become TL's per-expert `nn.Linear` weights (views).
MXFP4-quantized checkpoints (`*_blocks`/`*_scales`) are not supported: dequantize first.
`fold_value_biases` is skipped: with sinks a pattern row sums to less than 1.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from hooked.loading.common import strip_prefix, unembed_weights
from hooked.loading.llama import attention_weights, llama_shaped_config, local_attention, qwen_local_layers
from hooked.loading.registry import register_architecture


def convert_gpt_oss_config(hf: Any) -> dict:
    return dict(
        llama_shaped_config(hf, "GptOssForCausalLM"),
        num_experts=hf.num_local_experts,
        experts_per_token=hf.num_experts_per_tok,
        norm_topk_prob=True,
        swiglu_limit=hf.swiglu_limit,
        swiglu_alpha=hf.swiglu_alpha,
        attn_sinks=True,
        norm_gain_in_fp32=True,  # GptOssRMSNorm: (w * n32).to(dtype)
        norm_gain_fp32_in_float16=True,  # HF's `_keep_in_fp32_modules`: the norm weights stay float32 in float16
        **local_attention(hf.sliding_window, qwen_local_layers(hf)),
        default_prepend_bos=False,
    )


def gpt_oss_experts(hf: Mapping[str, torch.Tensor], p: str, cfg) -> dict[str, torch.Tensor]:
    """`router` and the fused, interleaved `experts.*` -> TL MoE keys (`nn.Linear` `[out, in]` views)."""
    if p + "experts.gate_up_proj_blocks" in hf:
        raise NotImplementedError("MXFP4-quantized GPT-OSS experts: load a dequantized (bf16/fp32) checkpoint")
    out = {"W_gate.weight": hf[p + "router.weight"], "W_gate.bias": hf[p + "router.bias"]}  # [E, d_model], [E]
    gate_up, gate_up_bias = hf[p + "experts.gate_up_proj"], hf[p + "experts.gate_up_proj_bias"]  # [E, d, 2I], [E, 2I]
    down, down_bias = hf[p + "experts.down_proj"], hf[p + "experts.down_proj_bias"]  # [E, I, d], [E, d]
    for e in range(cfg.num_experts):
        q = f"experts.{e}."
        out[q + "W_gate.weight"] = gate_up[e, :, 0::2].T  # [d_mlp, d_model]
        out[q + "W_gate.bias"] = gate_up_bias[e, 0::2]
        out[q + "W_in.weight"] = gate_up[e, :, 1::2].T  # [d_mlp, d_model]
        out[q + "W_in.bias"] = gate_up_bias[e, 1::2]
        out[q + "W_out.weight"] = down[e].T  # [d_model, d_mlp]
        out[q + "W_out.bias"] = down_bias[e]
    return out


def convert_gpt_oss_weights(hf_state: Mapping[str, torch.Tensor], cfg) -> dict[str, torch.Tensor]:
    hf = strip_prefix(hf_state, "model.")
    sd = {"embed.W_E": hf["embed_tokens.weight"]}  # [d_vocab, d_model]
    for layer in range(cfg.n_layers):
        p, b = f"layers.{layer}.", f"blocks.{layer}."
        sd[b + "ln1.w"] = hf[p + "input_layernorm.weight"]
        sd.update({b + k: v for k, v in attention_weights(hf, p + "self_attn.", cfg).items()})
        if cfg.attn_sinks:  # a config without sinks (TransformerLens's GPT-OSS) has no parameter to fill
            sd[b + "attn.sinks"] = hf[p + "self_attn.sinks"]  # [head]
        sd[b + "ln2.w"] = hf[p + "post_attention_layernorm.weight"]
        sd.update({b + "mlp." + k: v for k, v in gpt_oss_experts(hf, p + "mlp.", cfg).items()})
    sd["ln_final.w"] = hf["norm.weight"]
    sd.update(unembed_weights(hf.get("lm_head.weight"), sd["embed.W_E"]))
    return sd


register_architecture(("GptOssForCausalLM",), convert_gpt_oss_config, convert_gpt_oss_weights)
