"""`transformer_lens.pretrained.weight_conversions.convert_*_weights(hf_model, cfg)` on model objects.

TransformerLens's converters read the model's attributes, so they also accept objects that
have the attribute tree but no `state_dict()`; hooked's compatibility names do the same
through `ModuleTreeTensors`, and must give exactly what the state-dict path gives.
"""

from __future__ import annotations

import types

import pytest
import torch

from hooked.compat.pretrained import ModuleTreeTensors, convert_gpt_oss_weights, convert_llama_weights
from hooked.loading import get_architecture
from tests.tiny_models import MOE_CONFIGS, tiny_hf


def attribute_tree(hf):
    """The same submodules and tensors, reachable by attribute, but not an `nn.Module` (no `state_dict`)."""
    return types.SimpleNamespace(model=hf.model, lm_head=hf.lm_head)


def test_module_tree_resolves_tensors_only():
    layer = types.SimpleNamespace(w=torch.ones(2), name="not a tensor")
    tree = ModuleTreeTensors(types.SimpleNamespace(layers=[layer]))
    assert torch.equal(tree["layers.0.w"], torch.ones(2))
    assert "layers.0.w" in tree
    for absent in ("layers.0.name", "layers.1.w", "layers.0.missing", "nothing"):
        assert absent not in tree
        with pytest.raises(KeyError):
            tree[absent]
    assert tree.get("layers.3.w") is None


@pytest.mark.unchecked  # an attribute tree poses as a state dict; beartype's Mapping check would iterate it
@pytest.mark.parametrize("family", ["llama", "gpt_oss"])
def test_attribute_tree_converts_like_the_state_dict(family):
    from tests.tiny_models import tiny_llama_family

    if family == "llama":
        hf = tiny_llama_family("llama", num_attention_heads=4, num_key_value_heads=2)
        convert = convert_llama_weights
    else:
        prefix, overrides = MOE_CONFIGS["gpt_oss_sinks_clamped_swiglu"]
        hf = tiny_hf(prefix, **overrides)
        convert = convert_gpt_oss_weights
    from hooked.core.config import HookedTransformerConfig

    cfg = HookedTransformerConfig(**get_architecture(type(hf).__name__).config(hf.config))
    from_module = convert(hf, cfg)
    from_tree = convert(attribute_tree(hf), cfg)
    assert from_tree.keys() == from_module.keys()
    for key in from_module:
        assert torch.equal(from_tree[key], from_module[key]), key


def test_gpt_oss_config_without_sinks_reads_no_sinks():
    prefix, overrides = MOE_CONFIGS["gpt_oss_sinks_clamped_swiglu"]
    hf = tiny_hf(prefix, **overrides)
    from hooked.core.config import HookedTransformerConfig

    fields = get_architecture("GptOssForCausalLM").config(hf.config)
    with_sinks = convert_gpt_oss_weights(hf, HookedTransformerConfig(**fields))
    without = convert_gpt_oss_weights(hf, HookedTransformerConfig(**dict(fields, attn_sinks=False)))
    assert "blocks.0.attn.sinks" in with_sinks
    assert set(with_sinks) - set(without) == {
        f"blocks.{layer}.attn.sinks" for layer in range(hf.config.num_hidden_layers)
    }
