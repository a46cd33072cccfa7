"""The image-text converters (`loading/llava.py`, `loading/gemma3_multimodal.py`, `loading/vision_towers.py`):
key layouts of every transformers version, feature layers, and what they refuse."""

from __future__ import annotations

import copy

import pytest
import torch

from hooked import HookedTransformer
from hooked.core.errors import UnsupportedConfigError
from hooked.loading import get_architecture
from hooked.loading.vision_towers import resolve_feature_layers
from hooked.models.vision_language import HookedVisionLanguageModel
from tests.tiny_models import VLM_CONFIGS, tiny_vlm

torch.set_num_threads(1)


def _older_layout(state: dict, name: str) -> dict:
    """The keys of hub checkpoints saved before transformers 5 (`language_model.model.`, `vision_tower.vision_model.`,
    ...)."""
    qwen = name == "qwen2_5_vl"  # Qwen2.5-VL's hub files: `model.layers...` and `visual...`
    renames = (
        ("model.language_model.", "model." if qwen else "language_model.model."),
        ("model.visual.", "visual."),
        ("lm_head.", "lm_head." if qwen else "language_model.lm_head."),
        ("model.vision_tower.", "vision_tower.vision_model."),
        ("model.multi_modal_projector.", "multi_modal_projector."),
        ("model.image_newline", "image_newline"),
    )
    out = {}
    for key, value in state.items():
        for old, new in renames:
            if key.startswith(old):
                key = new + key.removeprefix(old)
                break
        out[key] = value
    return out


@pytest.mark.parametrize("name", list(VLM_CONFIGS))
def test_every_key_layout_converts_alike(name):
    hf = tiny_vlm(name, seed=2)
    arch = get_architecture(type(hf).__name__)
    model = HookedTransformer.from_pretrained_no_processing("tiny", hf_model=hf)
    memory = hf.state_dict()
    ours, older = arch.weights(memory, model.cfg), arch.weights(_older_layout(memory, name), model.cfg)
    assert set(ours) == set(older) == set(model.state_dict())
    assert all(torch.equal(ours[k], older[k]) for k in ours)


def test_feature_layers_resolve_and_only_the_blocks_read_are_built():
    assert resolve_feature_layers(-2, 24) == (23,) and resolve_feature_layers([-3, -2], 3) == (1, 2)
    with pytest.raises(ValueError, match="hidden states"):
        resolve_feature_layers(-5, 3)
    hf = tiny_vlm("llava_next")  # 3 ViT blocks, features from hidden states 1 and 2 (of 0..3)
    model = HookedTransformer.from_pretrained_no_processing("tiny", hf_model=hf)
    assert isinstance(model, HookedVisionLanguageModel)
    assert model.vcfg.feature_layers == (1, 2) and len(model.vision.blocks) == 2
    assert model.vcfg.d_features == 2 * model.vcfg.vision.d_model


@pytest.mark.parametrize(
    ("name", "change", "message"),
    [
        ("llava", lambda c: setattr(c.vision_config, "model_type", "pixtral"), "model_type"),
        ("llava", lambda c: setattr(c.text_config, "model_type", "gemma"), "model_type"),
        ("llava", lambda c: setattr(c.vision_config, "hidden_act", "mish"), "hidden_act"),
        ("llava_onevision", lambda c: setattr(c, "vision_aspect_ratio", "square"), "vision_aspect_ratio"),
        ("qwen2_5_vl", lambda c: c.text_config.rope_parameters.update(rope_type="yarn", factor=2.0), "rope_type"),
    ],
)
def test_unimplemented_config_values_are_refused(name, change, message):
    config = copy.deepcopy(tiny_vlm(name).config)
    change(config)
    with pytest.raises(UnsupportedConfigError, match=message):
        get_architecture(f"{VLM_CONFIGS[name][0]}ForConditionalGeneration").config(config)


def test_a_gemma3_image_text_config_without_vision_tower_loads_the_language_model():
    """Official names map Gemma 3 4B+ to a text-only config: the converter gives the language model alone."""
    from hooked.loading.gemma3_multimodal import convert_gemma3_image_text_config

    hf = tiny_vlm("gemma3_pooled")
    fields = convert_gemma3_image_text_config(hf.config.text_config)
    assert "vision_language" not in fields and fields["original_architecture"] == "Gemma3ForCausalLM"
    assert convert_gemma3_image_text_config(hf.config)["vision_language"]["bidirectional_image_attention"]
