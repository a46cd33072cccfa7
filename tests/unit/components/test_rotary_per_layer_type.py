"""Per-layer-type rotary (Gemma 3, OLMo 3): each layer type has its own base and scaling."""

from __future__ import annotations

import torch

from hooked import HookedTransformer, HookedTransformerConfig
from hooked.components.rotary import rotary_inv_freq
from hooked.loading.common import hf_rope_parameters, per_layer_type_rope


def gemma3_text_config(**overrides):
    from transformers import Gemma3TextConfig

    kwargs = dict(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=3,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        vocab_size=64,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 5000.0},
        },
    )
    kwargs.update(overrides)
    return Gemma3TextConfig(**kwargs)


def test_per_layer_type_rope_reads_each_layer_type():
    fields = per_layer_type_rope(gemma3_text_config())
    assert fields["rotary_base"] == 5000.0 and fields["rotary_scaling"] == {"rope_type": "linear", "factor": 8.0}
    assert fields["rotary_base_local"] == 100.0 and fields["rotary_scaling_local"] is None


def test_hf_rope_parameters_needs_a_layer_type_for_per_type_dicts():
    import pytest

    hf = gemma3_text_config()
    with pytest.raises(NotImplementedError, match="layer_type"):
        hf_rope_parameters(hf)
    assert hf_rope_parameters(hf, layer_type="sliding_attention") == (100.0, None)


def test_shared_rope_parameters_give_global_fields_only():
    from transformers import LlamaConfig

    fields = per_layer_type_rope(LlamaConfig(rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 7.0}))
    assert fields == {"rotary_base": 7.0, "rotary_scaling": {"rope_type": "linear", "factor": 2.0}}


def test_layers_use_their_type_frequencies_and_share_tables():
    cfg = HookedTransformerConfig(
        d_model=32,
        d_head=16,
        n_layers=3,
        n_ctx=32,
        d_vocab=64,
        act_fn="gelu",
        normalization_type="RMS",
        positional_embedding_type="rotary",
        rotary_base=5000.0,
        rotary_scaling={"rope_type": "linear", "factor": 8.0},
        rotary_base_local=100.0,
        use_local_attn=True,
        window_size=4,
        attn_types=["local", "global", "local"],
        seed=0,
    )
    model = HookedTransformer(cfg)
    local, glob = rotary_inv_freq(16, 100.0), rotary_inv_freq(16, 5000.0) / 8.0
    assert torch.equal(model.blocks[0].attn.inv_freq, local) and torch.equal(model.blocks[2].attn.inv_freq, local)
    assert torch.equal(model.blocks[1].attn.inv_freq, glob)
    with torch.no_grad():
        model(torch.arange(10)[None])
    keys = [k for k in model.forward_state._memo if isinstance(k, tuple) and k[0] == "rotary"]
    assert len(keys) == 2  # one cos/sin table per layer type, shared by both local layers
