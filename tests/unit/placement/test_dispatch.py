"""hooked.placement.dispatch: device maps from from_pretrained's arguments, and dispatching a model built in memory."""

from __future__ import annotations

import pytest
import torch

from hooked import HookedTransformer, HookedTransformerConfig
from hooked.placement.dispatch import dispatch, model_parts, part_sizes, read_weight, resolve_device_map

BASE = dict(d_model=32, d_head=8, n_layers=4, n_ctx=32, d_vocab=60, act_fn="gelu_new", seed=0, device="cpu")


def make(**overrides) -> HookedTransformer:
    return HookedTransformer(HookedTransformerConfig(**{**BASE, **overrides}))


def toks(batch=2, pos=6):
    return torch.randint(0, 60, (batch, pos), generator=torch.Generator().manual_seed(0))


def test_parts_are_the_top_level_modules_with_tensors_in_forward_order():
    model = make(positional_embedding_type="standard")
    assert model_parts(model) == ["embed", "pos_embed", *[f"blocks.{i}" for i in range(4)], "ln_final", "unembed"]
    sizes = part_sizes(model)
    assert sizes["blocks.0"] == sum(p.numel() * 4 for p in model.blocks[0].parameters())
    assert part_sizes(model, torch.bfloat16)["blocks.0"] == sizes["blocks.0"] // 2


def test_no_placement_arguments_mean_no_map():
    assert resolve_device_map(make()) is None


def test_max_memory_plans_a_contiguous_cpu_then_disk_map():
    model = make()
    sizes = part_sizes(model)
    budget = sizes["embed"] + sizes["pos_embed"] + 2 * sizes["blocks.0"]
    plan = resolve_device_map(model, max_memory={"cpu": budget})
    assert [plan[p] for p in model_parts(model)] == ["cpu"] * 4 + ["disk"] * 4


def test_auto_without_max_memory_fits_this_small_model_on_the_cpu():
    assert set(resolve_device_map(make(), device_map="auto").values()) == {"cpu"}


def test_user_maps_inherit_from_parents_and_are_checked():
    model = make()
    plan = resolve_device_map(model, device_map={"": "cpu", "blocks.3": "disk", "unembed": "disk"})
    assert plan["blocks.2"] == "cpu" and plan["blocks.3"] == plan["unembed"] == "disk"
    assert set(resolve_device_map(model, device_map={"": 0}).values()) == {"cuda:0"}
    with pytest.raises(ValueError, match="not modules of this model"):
        resolve_device_map(model, device_map={"": "cpu", "blocks.9": "cpu"})
    with pytest.raises(ValueError, match="gives no device for 'embed'"):
        resolve_device_map(model, device_map={"blocks": "cpu"})
    with pytest.raises(ValueError, match="device_map must be"):
        resolve_device_map(model, device_map="everywhere")


def test_dispatching_an_in_memory_model_to_disk_keeps_its_outputs(tmp_path):
    model, plain = make(), make()
    expected = plain(toks())
    plan = resolve_device_map(model, device_map={"": "cpu", "blocks.2": "disk", "blocks.3": "disk", "unembed": "disk"})
    dispatch(model, plan, offload_folder=str(tmp_path))
    assert model.blocks[3].attn.W_Q.device.type == "meta" and model.hf_device_map == plan
    torch.testing.assert_close(model(toks()), expected, atol=0, rtol=0)
    torch.testing.assert_close(read_weight(model.blocks[3], "attn.W_Q"), plain.blocks[3].attn.W_Q, atol=0, rtol=0)
    torch.testing.assert_close(model.W_U, plain.W_U, atol=0, rtol=0)


def test_disk_without_an_offload_folder_is_refused():
    model = make()
    with pytest.raises(ValueError, match="pass offload_folder=DIR"):
        dispatch(model, resolve_device_map(model, device_map={"": "cpu", "unembed": "disk"}))
