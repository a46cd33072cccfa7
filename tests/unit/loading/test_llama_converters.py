"""The LLaMA-family converters as pure functions: HF config fields in, `HookedTransformerConfig` fields out."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from hooked.core.config import HookedTransformerConfig
from hooked.loading import supported_architectures
from hooked.loading.common import hf_rope_parameters
from hooked.loading.llama import (
    convert_llama_config,
    convert_llama_weights,
    convert_mistral_config,
    convert_qwen2_config,
    convert_qwen3_config,
)

SMALL = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, vocab_size=50)


def test_registered():
    for name in ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"):
        assert name in supported_architectures()


def test_rope_parameters_transformers_5_config():
    from transformers import LlamaConfig

    llama3 = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0)
    hf = LlamaConfig(**SMALL, max_position_embeddings=4096, rope_parameters=dict(llama3, rope_theta=5e5))
    base, scaling = hf_rope_parameters(hf)
    assert base == 5e5
    assert scaling == dict(llama3, original_max_position_embeddings=4096)  # filled in as HF does


def test_rope_parameters_transformers_4_style_config():
    def legacy(rope_theta, rope_scaling):
        return SimpleNamespace(rope_theta=rope_theta, rope_scaling=rope_scaling, max_position_embeddings=2048)

    linear = {"type": "linear", "factor": 4.0}  # the pre-4.45 key `type`
    assert hf_rope_parameters(legacy(1e6, linear)) == (1e6, {"rope_type": "linear", "factor": 4.0})
    assert hf_rope_parameters(legacy(5e5, None)) == (5e5, None)
    llama3 = hf_rope_parameters(legacy(5e5, {"rope_type": "llama3", "factor": 8.0}))[1]
    assert llama3["original_max_position_embeddings"] == 2048


def test_llama_config_fields():
    from transformers import LlamaConfig

    hf = LlamaConfig(**SMALL, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-5, max_position_embeddings=131072)
    cfg = HookedTransformerConfig.from_dict(convert_llama_config(hf))
    assert (cfg.d_model, cfg.d_head, cfg.n_heads, cfg.n_key_value_heads, cfg.d_mlp) == (32, 16, 4, 2, 64)
    assert cfg.n_ctx == 131072  # no 2048 cap (docs/transformerlens-migration.md, "What differs")
    assert cfg.rotary_dim == 16 and cfg.rotary_scaling is None and cfg.eps == 1e-5
    assert cfg.default_prepend_bos and not cfg.use_local_attn and not cfg.use_qk_norm


def test_mha_has_no_key_value_heads():
    from transformers import LlamaConfig

    cfg = HookedTransformerConfig.from_dict(convert_llama_config(LlamaConfig(**SMALL)))
    assert cfg.n_key_value_heads is None and cfg.n_kv_heads == 4


def test_mistral_window_on_every_layer_or_none():
    from transformers import MistralConfig

    cfg = convert_mistral_config(MistralConfig(**SMALL, sliding_window=7))
    assert (cfg["use_local_attn"], cfg["window_size"], cfg["attn_types"]) == (True, 7, ["local", "local"])
    assert "use_local_attn" not in convert_mistral_config(MistralConfig(**SMALL, sliding_window=None))


def test_qwen_sliding_window_layers():
    from transformers import Qwen2Config, Qwen3Config

    off = convert_qwen2_config(Qwen2Config(**SMALL, use_sliding_window=False, sliding_window=4))
    assert "use_local_attn" not in off and off["default_prepend_bos"] is False
    hf = Qwen3Config(**SMALL, head_dim=8, use_sliding_window=True, sliding_window=4, max_window_layers=1)
    on = convert_qwen3_config(hf)
    assert (on["window_size"], on["attn_types"], on["use_qk_norm"]) == (4, ["global", "local"], True)


def test_qwen_transformers_4_style_config_without_layer_types():
    legacy = SimpleNamespace(
        **SMALL, num_key_value_heads=2, hidden_act="silu", rms_norm_eps=1e-6, max_position_embeddings=32768,
        rope_theta=1e6, rope_scaling=None, use_sliding_window=True, sliding_window=4096, max_window_layers=1,
    )  # fmt: skip
    cfg = convert_qwen2_config(legacy)
    assert cfg["attn_types"] == ["global", "local"] and cfg["rotary_base"] == 1e6 and cfg["d_head"] == 8
    legacy.use_sliding_window = False  # 4.x keeps sliding_window set even when unused
    assert "use_local_attn" not in convert_qwen2_config(legacy)


def _fake_state(d=32, H=4, Hkv=2, dh=8, dm=64, V=50, L=1, lm_head=True):
    state = {"model.embed_tokens.weight": torch.randn(V, d), "model.norm.weight": torch.randn(d)}
    shapes = {
        "input_layernorm.weight": (d,),
        "post_attention_layernorm.weight": (d,),
        "self_attn.q_proj.weight": (H * dh, d),
        "self_attn.q_proj.bias": (H * dh,),  # the only bias present: the others must become zeros
        "self_attn.k_proj.weight": (Hkv * dh, d),
        "self_attn.v_proj.weight": (Hkv * dh, d),
        "self_attn.o_proj.weight": (d, H * dh),
        "mlp.gate_proj.weight": (dm, d),
        "mlp.up_proj.weight": (dm, d),
        "mlp.down_proj.weight": (d, dm),
    }
    for layer in range(L):
        state.update({f"model.layers.{layer}.{k}": torch.randn(shape) for k, shape in shapes.items()})
    if lm_head:
        state["lm_head.weight"] = torch.randn(V, d)
    return state


def test_weights_shapes_gqa_keys_and_zero_biases():
    from transformers import LlamaConfig

    hf = LlamaConfig(**dict(SMALL, num_hidden_layers=1), num_key_value_heads=2)
    cfg = HookedTransformerConfig.from_dict(convert_llama_config(hf))
    state = _fake_state()
    sd = convert_llama_weights(state, cfg)
    assert sd["blocks.0.attn.W_Q"].shape == (4, 32, 8) and sd["blocks.0.attn._W_K"].shape == (2, 32, 8)
    assert "blocks.0.attn.W_K" not in sd and sd["blocks.0.attn.W_O"].shape == (4, 8, 32)
    q = state["model.layers.0.self_attn.q_proj.weight"]  # [head * d_head, d_model]
    assert torch.equal(sd["blocks.0.attn.W_Q"][1], q[8:16].T)  # head 1 = rows 8..15
    assert torch.equal(sd["blocks.0.attn.b_Q"].flatten(), state["model.layers.0.self_attn.q_proj.bias"])
    assert not sd["blocks.0.attn._b_K"].any() and not sd["blocks.0.attn.b_O"].any()
    assert sd["blocks.0.attn.b_O"].shape == (32,) and sd["blocks.0.mlp.b_gate"].shape == (64,)
    assert sd["blocks.0.mlp.W_gate"].shape == (32, 64) and sd["blocks.0.mlp.W_out"].shape == (64, 32)
    assert sd["blocks.0.attn.W_Q"].data_ptr() == q.data_ptr()  # views, no copies
    assert torch.equal(sd["unembed.W_U"], state["lm_head.weight"].T)


def test_weights_tied_when_lm_head_absent():
    from transformers import LlamaConfig

    hf = LlamaConfig(**dict(SMALL, num_hidden_layers=1), num_key_value_heads=2)
    cfg = HookedTransformerConfig.from_dict(convert_llama_config(hf))
    sd = convert_llama_weights(_fake_state(lm_head=False), cfg)
    assert sd["unembed.W_U"].data_ptr() == sd["embed.W_E"].data_ptr() and sd["unembed.W_U"].shape == (32, 50)


def test_unsupported_rope_scaling_fails_before_any_forward():
    from transformers import LlamaConfig

    from hooked import HookedTransformer

    fields = convert_llama_config(LlamaConfig(**SMALL))
    fields["rotary_scaling"] = dict(rope_type="ntk_by_parts", factor=4.0)  # a kind components/rotary.py lacks
    with pytest.raises(NotImplementedError, match="ntk_by_parts"):
        HookedTransformer(fields)
