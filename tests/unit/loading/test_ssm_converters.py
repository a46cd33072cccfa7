"""The state-space and hybrid converters: what is special in each, and what they refuse."""

from __future__ import annotations

import pytest
import torch

from hooked.core.errors import UnsupportedConfigError
from hooked.loading import get_architecture
from tests.tiny_models import tiny_ssm

torch.set_num_threads(1)


def test_qwen3_next_interleaved_projections_become_qwen3_5_order():
    """Per key head, Qwen3-Next stores [q, k, v, z] and [b, a]; W_in holds all q, all k, all v, z, b, a."""
    from hooked.loading.qwen3_next import _deltanet_projections

    hf = tiny_ssm("qwen3_next_moe")
    arch = get_architecture("Qwen3NextForCausalLM")
    cfg = type("Cfg", (), arch.config(hf.config))  # the converter reads plain attributes
    layer = hf.model.layers[0].linear_attn
    qkv, z, b, a = _deltanet_projections(hf.state_dict(), "model.layers.0.linear_attn.", cfg)
    x = torch.randn(1, 3, hf.config.hidden_size)
    with torch.no_grad():
        parts = layer.fix_query_key_value_ordering(layer.in_proj_qkvz(x), layer.in_proj_ba(x))
    q_hf, k_hf, v_hf, z_hf, b_hf, a_hf = (t.reshape(3, -1) for t in parts)
    x = x[0]
    ours = x @ qkv.T
    key_dim = cfg.deltanet_n_key_heads * cfg.deltanet_d_key_head
    torch.testing.assert_close(ours[:, :key_dim], q_hf)
    torch.testing.assert_close(ours[:, key_dim : 2 * key_dim], k_hf)
    torch.testing.assert_close(ours[:, 2 * key_dim :], v_hf)
    torch.testing.assert_close(x @ z.T, z_hf)
    torch.testing.assert_close((x @ b.T, x @ a.T), (b_hf, a_hf))


def test_lfm2_mlp_width_follows_hf():
    from hooked.loading.lfm2 import lfm2_mlp_width

    hf = tiny_ssm("lfm2")
    assert lfm2_mlp_width(hf.config, hf.config.intermediate_size) == hf.model.layers[0].feed_forward.w1.out_features


def test_nemotron_h_moe_layers_are_refused():
    hf_config = tiny_ssm("nemotron_h").config
    hf_config.layers_block_type = ["linear_attention", "moe", "full_attention", "mlp", "linear_attention"]
    with pytest.raises(UnsupportedConfigError, match="layers_block_type"):
        get_architecture("NemotronHForCausalLM").config(hf_config)


def test_granite_hybrid_rope_kinds_are_checked():
    hf_config = tiny_ssm("granite_hybrid_moe").config
    hf_config.position_embedding_type = "alibi"
    with pytest.raises(UnsupportedConfigError, match="position_embedding_type"):
        get_architecture("GraniteMoeHybridForCausalLM").config(hf_config)


def test_hybrid_layer_types_come_from_hf():
    for name, cls, expected in (
        ("nemotron_h", "NemotronHForCausalLM", ["mamba2", "mlp", "attention", "mlp", "mamba2"]),
        ("granite_hybrid_moe", "GraniteMoeHybridForCausalLM", ["mamba2", "attention", "mamba2", "mamba2"]),
        ("lfm2", "Lfm2ForCausalLM", ["short_conv", "attention", "short_conv", "short_conv"]),
    ):
        fields = get_architecture(cls).config(tiny_ssm(name).config)
        assert fields["layer_types"] == expected, name
