"""Splitting a model into pipeline stages and selecting each stage's checkpoint tensors (no process group)."""

from __future__ import annotations

import pytest
import torch

from hooked.core.errors import InputError
from hooked.scale.stage_loading import (
    StageStateView,
    _layer_of_checkpoint_key,
    make_stage,
    meta_except_owned,
    needed_keys,
    owner_of,
    split_layers,
    trace_sources,
)


@pytest.mark.parametrize("n_layers,world", [(32, 3), (4, 4), (5, 2), (30, 7), (1, 1)])
def test_split_is_contiguous_balanced_and_complete(n_layers, world):
    stages = split_layers(n_layers, world)
    assert len(stages) == world and [layer for s in stages for layer in s] == list(range(n_layers))
    sizes = [len(s) for s in stages]
    assert max(sizes) - min(sizes) <= 1 and min(sizes) >= 1 and sizes == sorted(sizes, reverse=True)


def test_more_ranks_than_blocks_is_refused():
    with pytest.raises(InputError, match="3 ranks but the model has only 2 blocks"):
        split_layers(2, 3)


def test_owner_of_names():
    assert owner_of("hook_embed", 3, 7) == 0 and owner_of("embed.W_E", 3, 7) == 0
    assert owner_of("unembed.W_U", 3, 7) == 2 and owner_of("ln_final.hook_scale", 3, 7) == 2
    assert [owner_of(f"blocks.{layer}.attn.W_Q", 3, 7) for layer in range(7)] == [0, 0, 0, 1, 1, 2, 2]


def _llama(tied: bool):
    from hooked.loading.pretrained import build_config
    from tests.tiny_models import tiny_hf

    hf = tiny_hf("Llama", num_hidden_layers=4, num_key_value_heads=2, tie_word_embeddings=tied)
    state = {k: v for k, v in hf.state_dict().items() if not (tied and k == "lm_head.weight")}
    return state, build_config(hf.config, "LlamaForCausalLM", "tiny")


def test_tracing_finds_each_converted_tensors_sources():
    from hooked.loading.registry import get_architecture

    state, cfg = _llama(tied=False)
    sources = trace_sources(get_architecture("LlamaForCausalLM").weights, state, cfg)
    assert sources["unembed.W_U"] == {"lm_head.weight"}
    assert sources["embed.W_E"] == {"model.embed_tokens.weight"}
    assert sources["blocks.2.attn.W_Q"] == {"model.layers.2.self_attn.q_proj.weight"}
    assert sources["blocks.1.ln2.w"] == {"model.layers.1.post_attention_layernorm.weight"}


@pytest.mark.parametrize("tied", [False, True])
def test_each_stage_needs_only_its_tensors(tied):
    from hooked.loading.registry import get_architecture

    state, cfg = _llama(tied)
    convert = get_architecture("LlamaForCausalLM").weights
    first, last = (needed_keys(convert, state, cfg, make_stage(4, 2, r)) for r in (0, 1))
    assert {k for k in first if "layers." not in k} == {"model.embed_tokens.weight"}
    head = {"model.embed_tokens.weight" if tied else "lm_head.weight", "model.norm.weight"}
    assert {k for k in last if "layers." not in k} == head
    assert all(int(k.split(".")[2]) in (0, 1) for k in first if "layers." in k)
    assert all(int(k.split(".")[2]) in (2, 3) for k in last if "layers." in k)


def test_stage_view_reads_only_needed_keys_and_others_become_meta():
    from hooked.loading.registry import get_architecture

    state, cfg = _llama(tied=False)
    stage = make_stage(4, 2, 1)
    convert = get_architecture("LlamaForCausalLM").weights
    view = StageStateView(state, needed_keys(convert, state, cfg, stage))
    converted = meta_except_owned(convert(view, cfg), stage)
    assert set(view.requested) == view.needed
    assert converted["embed.W_E"].is_meta and converted["blocks.0.attn.W_Q"].is_meta
    full = convert(state, cfg)
    for name in ("blocks.3.attn.W_Q", "blocks.2.mlp.W_in", "unembed.W_U", "ln_final.w"):
        torch.testing.assert_close(converted[name], full[name], atol=0, rtol=0)


def _family_cases() -> dict:
    from tests.acceptance import test_modern_families_parity as modern
    from tests.tiny_models import GEMMA_CONFIGS, MOE_CONFIGS, tiny_gemma, tiny_moe

    cases = {f"modern:{n}": (lambda n=n: modern.build(n)) for n in modern.CASES}
    cases.update({f"moe:{n}": (lambda n=n: tiny_moe(MOE_CONFIGS[n][0], 0, **MOE_CONFIGS[n][1])) for n in MOE_CONFIGS})
    cases.update({f"gemma:{n}": (lambda n=n: tiny_gemma(n)) for n in GEMMA_CONFIGS})
    return cases


FAMILIES = _family_cases()


@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_stage_converts_exactly_its_part_of_every_family(family):
    """Per-stage conversion (traced key selection, the rest meta) equals the whole conversion, family by family."""
    from hooked.loading.pretrained import build_config
    from hooked.loading.registry import get_architecture

    hf = FAMILIES[family]()
    state, arch = hf.state_dict(), type(hf).__name__
    cfg = build_config(hf.config, arch, "tiny")
    if cfg.vision_language is not None:  # Gemma 3's image-text class loads with its vision tower: no stage owns it
        from hooked import HookedTransformer
        from hooked.loading.options import LoadOptions
        from hooked.scale.stage_model import load_stage

        with pytest.raises(InputError, match="image-text model: pipeline=True is not supported"):
            load_stage(HookedTransformer, "tiny", 0, 2, torch.device("cpu"), LoadOptions(hf_model=hf))
        return
    convert = get_architecture(arch).weights
    trace_sources(convert, state, cfg)  # tracing works for this converter (no fallback to key names)
    full = convert(state, cfg)
    for rank in range(2):
        stage = make_stage(cfg.n_layers, 2, rank)
        view = StageStateView(state, needed_keys(convert, state, cfg, stage))
        converted = meta_except_owned(convert(view, cfg), stage)
        owned = [k for k in converted if stage.owns_name(k)]
        assert owned and set(converted) == set(full)
        for name in owned:
            torch.testing.assert_close(converted[name], full[name], atol=0, rtol=0)
        layers = {_layer_of_checkpoint_key(k) for k in view.requested} - {None}
        assert layers == set(stage.layers)  # every block of the stage, and no other block, was read
