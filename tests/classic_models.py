"""Tiny random HF models of the classic families (issue 13), shared by their acceptance and toolkit tests.

Odd sizes (d_model 48, 3 or 6 heads, d_mlp 72, vocab 97), fp32, eager attention, 2 layers.
Every parameter is redrawn away from HF's init (std 0.02, gains 1, biases 0), where attention
is nearly uniform and masking or rotary bugs barely move the logits: q/k projections (fused
ones included) get N(0, 0.25^2) so patterns are far from uniform, every other matrix and bias
N(0, 0.1^2), norm gains 1 + N(0, 0.2^2) and norm biases N(0, 0.1^2).
"""

from __future__ import annotations

import copy
import re

import torch

VOCAB = 97
BASE = dict(vocab_size=VOCAB, bos_token_id=1, eos_token_id=2, attn_implementation="eager")

# name -> (transformers config class, model class, config kwargs)
FAMILIES = {
    # Pythia layout: parallel residual, rotary on a quarter of each head (4 of 16 dims).
    "neox_parallel_rot025": ("GPTNeoXConfig", "GPTNeoXForCausalLM", dict(
        hidden_size=48, num_attention_heads=3, intermediate_size=72, num_hidden_layers=2, max_position_embeddings=64,
        use_parallel_residual=True,
        rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.25),
    )),
    "neox_sequential_rot025": ("GPTNeoXConfig", "GPTNeoXForCausalLM", dict(
        hidden_size=48, num_attention_heads=3, intermediate_size=72, num_hidden_layers=2, max_position_embeddings=64,
        use_parallel_residual=False,
        rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.25),
    )),
    # Adjacent-pair rotary on 8 of 16 dims; one shared LayerNorm; lm_head bias.
    "gptj_rotary8of16": ("GPTJConfig", "GPTJForCausalLM", dict(
        n_embd=48, n_head=3, n_inner=72, n_layer=2, n_positions=64, rotary_dim=8,
    )),
    # Global then local layer, window 4 < sequence 12; no 1/sqrt(d_head) scaling.
    "gpt_neo_window4": ("GPTNeoConfig", "GPTNeoForCausalLM", dict(
        hidden_size=48, num_heads=3, intermediate_size=72, num_layers=2, max_position_embeddings=64,
        attention_types=[[["global", "local"], 1]], window_size=4,
    )),
    # Partial rotary 0.5; parallel block with one norm; lm_head bias.
    "phi_rot05": ("PhiConfig", "PhiForCausalLM", dict(
        hidden_size=48, num_attention_heads=3, intermediate_size=72, num_hidden_layers=2, max_position_embeddings=64,
        rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.5),
    )),
    # Phi's optional qk LayerNorm (one, with bias, shared by the heads) with grouped-query attention.
    "phi_qk_layernorm_gqa": ("PhiConfig", "PhiForCausalLM", dict(
        hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=72, num_hidden_layers=2,
        max_position_embeddings=64, qk_layernorm=True,
        rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.5),
    )),
    # Learned positions at offset 2, relu, tied.
    "opt": ("OPTConfig", "OPTForCausalLM", dict(
        hidden_size=48, num_attention_heads=3, ffn_dim=72, num_hidden_layers=2, max_position_embeddings=64,
        word_embed_proj_dim=48, pad_token_id=1,
    )),
    # ALiBi with 6 heads (not a power of two: 4 slopes from base 2^-2, 2 from base 2^-1); post-embedding LN.
    "bloom_6heads": ("BloomConfig", "BloomForCausalLM", dict(hidden_size=48, n_head=6, n_layer=2)),
    # Per-head qk LayerNorm, GQA 4:2, partial rotary 0.25 (4 of 16), SwiGLU.
    "stablelm_qk_norm_gqa": ("StableLmConfig", "StableLmForCausalLM", dict(
        hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=72, num_hidden_layers=2,
        max_position_embeddings=64, qk_layernorm=True, use_qkv_bias=True,
    )),
    # StableLM's parallel block (one norm) without qk-norm.
    "stablelm_parallel": ("StableLmConfig", "StableLmForCausalLM", dict(
        hidden_size=48, num_attention_heads=3, num_key_value_heads=3, intermediate_size=72, num_hidden_layers=2,
        max_position_embeddings=64, use_parallel_residual=True,
        rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.5),
    )),
    # Multi-query attention ([Q; K; V] blocks) with learned positions.
    "bigcode_mqa": ("GPTBigCodeConfig", "GPTBigCodeForCausalLM", dict(
        n_embd=48, n_head=3, n_inner=72, n_layer=2, n_positions=64, multi_query=True,
    )),
    # GQA 4:2, sliding window 5 < sequence 12, LayerNorm with biases, dense gelu MLP.
    "starcoder2_gqa_window5": ("Starcoder2Config", "Starcoder2ForCausalLM", dict(
        hidden_size=48, num_attention_heads=4, num_key_value_heads=2, intermediate_size=72, num_hidden_layers=2,
        max_position_embeddings=64, sliding_window=5,
    )),
}  # fmt: skip

_QK = re.compile(r"(q_proj|k_proj|query_key_value|c_attn)\.weight$")
_NORM = re.compile(r"(norm|ln_)")


def tiny_classic(name: str, seed: int = 0):
    """The HF model of `FAMILIES[name]`, eager attention, every parameter redrawn (module docstring)."""
    import transformers

    config_cls, model_cls, kwargs = FAMILIES[name]
    config = getattr(transformers, config_cls)(**BASE, **copy.deepcopy(kwargs))
    torch.manual_seed(seed)
    hf = getattr(transformers, model_cls)(config).eval()
    with torch.no_grad():
        for pname, p in hf.named_parameters():
            if _NORM.search(pname) and p.ndim == 1 or "norms." in pname:
                p.copy_((1 if pname.endswith("weight") else 0) + 0.2 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.25 if _QK.search(pname) else 0.1)
    return hf


def hf_layers(hf) -> torch.nn.ModuleList:
    """The decoder layers of any of the families above."""
    base = hf.base_model
    for attr in ("layers", "h"):
        if hasattr(base, attr):
            return getattr(base, attr)
    return base.decoder.layers  # OPT
