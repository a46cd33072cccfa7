"""Class-level fast attribute access keeps nn.Module's attribute semantics."""

import inspect

import pytest
import torch
import torch.nn as nn

from hooked import HookedTransformer, HookedTransformerConfig
from hooked.core.fast_attributes import RegisteredAttribute, install_fast_attributes

CFG = dict(d_model=16, d_head=4, n_layers=1, n_ctx=8, d_vocab=20, act_fn="silu", normalization_type="RMS",
           positional_embedding_type="rotary", gated_mlp=True, n_key_value_heads=2, seed=0)  # fmt: skip


def make():
    return HookedTransformer(HookedTransformerConfig(**CFG))


def test_descriptors_installed_on_project_classes_only():
    model = make()
    attn_cls = type(model.blocks[0].attn)  # may inherit the descriptor from Attention
    assert isinstance(inspect.getattr_static(attn_cls, "W_Q"), RegisteredAttribute)
    assert isinstance(inspect.getattr_static(type(model.blocks[0]), "hook_resid_pre"), RegisteredAttribute)
    assert not hasattr(nn.ModuleList, "0")
    assert isinstance(inspect.getattr_static(attn_cls, "W_K"), property)  # grouped-query view left alone


def test_reads_are_the_registered_objects():
    model = make()
    attn = model.blocks[0].attn
    assert attn.W_Q is attn._parameters["W_Q"]
    assert attn.hook_q is attn._modules["hook_q"]
    assert attn.inv_freq is attn._buffers["inv_freq"]


def test_assignment_deletion_and_missing_names_behave_as_nn_module():
    model, other = make(), make()
    attn = model.blocks[0].attn
    new = nn.Parameter(torch.zeros_like(attn.W_Q))
    attn.W_Q = new
    assert attn.W_Q is new and attn._parameters["W_Q"] is new and "W_Q" not in attn.__dict__
    assert other.blocks[0].attn.W_Q is not new  # per instance, as before
    with pytest.raises(TypeError):
        attn.W_Q = torch.zeros(3)  # nn.Module refuses a plain tensor over a parameter
    del attn.b_Q
    assert not hasattr(attn, "b_Q")
    with pytest.raises(AttributeError, match="has no attribute 'b_Q'"):
        _ = attn.b_Q
    assert not hasattr(model.blocks[0].mlp, "ln")  # registered by other configs only (solu_ln)


def test_replaced_parameter_is_used_by_forward():
    model = make()
    tokens = torch.tensor([[1, 2, 3]])
    before = model(tokens)
    mlp = model.blocks[0].mlp
    mlp.W_out = nn.Parameter(torch.zeros_like(mlp.W_out))
    mlp.b_out = nn.Parameter(torch.zeros_like(mlp.b_out))
    _, cache = model.run_with_cache(tokens)
    torch.testing.assert_close(cache["blocks.0.hook_mlp_out"], torch.zeros(1, 3, 16), atol=0, rtol=0)
    assert not torch.equal(model(tokens), before)


def test_install_twice_is_a_no_op():
    model = make()
    descriptor = inspect.getattr_static(type(model.blocks[0].attn), "W_Q")
    install_fast_attributes(model)
    assert inspect.getattr_static(type(model.blocks[0].attn), "W_Q") is descriptor
