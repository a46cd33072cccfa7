"""Config facts and refusals of the classic converters (`loading/<family>.py`), on HF configs alone."""

from __future__ import annotations

import pytest
import torch

from hooked import loading
from tests.tiny_models import CLASSIC_FAMILIES, tiny_classic


def config_of(name: str):
    import transformers

    config_cls, _, kwargs = CLASSIC_FAMILIES[name]
    return getattr(transformers, config_cls)(vocab_size=97, **kwargs)


def convert(name: str, hf_config=None) -> dict:
    arch = CLASSIC_FAMILIES[name][1]
    return loading.get_architecture(arch).config(hf_config or config_of(name))


def test_opt_350m_post_layernorm_layout_is_refused_clearly():
    import transformers

    post_ln = transformers.OPTConfig(hidden_size=48, num_attention_heads=3, do_layer_norm_before=False)
    with pytest.raises(NotImplementedError, match="post-LayerNorm.*opt-350m"):
        loading.get_architecture("OPTForCausalLM").config(post_ln)
    projected = transformers.OPTConfig(hidden_size=48, num_attention_heads=3, word_embed_proj_dim=32)
    with pytest.raises(NotImplementedError, match="word_embed_proj_dim=32"):
        loading.get_architecture("OPTForCausalLM").config(projected)


def test_bloom_post_layernorm_residual_is_refused():
    import transformers

    hf = transformers.BloomConfig(hidden_size=48, n_head=6, apply_residual_connection_post_layernorm=True)
    with pytest.raises(NotImplementedError, match="apply_residual_connection_post_layernorm"):
        loading.get_architecture("BloomForCausalLM").config(hf)


def test_unsupported_class_error_lists_every_family():
    with pytest.raises(NotImplementedError) as err:
        loading.get_architecture("RwkvForCausalLM")  # (Mamba was the example before it was supported)
    for _, arch, _ in CLASSIC_FAMILIES.values():
        assert arch in str(err.value)


def test_partial_rotary_and_block_facts():
    assert convert("neox_parallel_rot025")["rotary_dim"] == 4 and convert("neox_parallel_rot025")["parallel_attn_mlp"]
    assert not convert("neox_sequential_rot025")["parallel_attn_mlp"]
    gptj = convert("gptj_rotary8of16")
    assert (gptj["rotary_dim"], gptj["rotary_adjacent_pairs"], gptj["parallel_attn_mlp"]) == (8, True, True)
    assert convert("phi_rot05")["rotary_dim"] == 8
    neo = convert("gpt_neo_window4")
    assert (neo["attn_types"], neo["window_size"], neo["use_attn_scale"]) == (["global", "local"], 4, False)
    assert convert("bigcode_mqa")["n_key_value_heads"] == 1
    assert convert("bloom_6heads")["positional_embedding_type"] == "alibi"


def test_old_neox_configs_read_rotary_pct():
    class OldNeoX:  # a transformers 4.x style config: no rope_parameters
        rotary_pct = 0.25

    from hooked.loading.parts import partial_rotary_dim

    assert partial_rotary_dim(OldNeoX(), 64) == 16


def test_shared_norm_is_one_tensor_in_ln1_and_ln2():
    hf = tiny_classic("gptj_rotary8of16")
    sd = loading.get_architecture("GPTJForCausalLM").weights(hf.state_dict(), _cfg(hf))
    assert sd["blocks.0.ln1.w"] is sd["blocks.0.ln2.w"] and sd["blocks.0.ln1.b"] is sd["blocks.0.ln2.b"]
    assert torch.equal(sd["unembed.b_U"], hf.lm_head.bias)


def test_opt_positions_drop_the_offset_rows():
    hf = tiny_classic("opt")
    sd = loading.get_architecture("OPTForCausalLM").weights(hf.state_dict(), _cfg(hf))
    assert torch.equal(sd["pos_embed.W_pos"], hf.model.decoder.embed_positions.weight[2:])


def _cfg(hf):
    from hooked.loading.pretrained import build_config

    return build_config(hf.config, type(hf).__name__, "tiny")
