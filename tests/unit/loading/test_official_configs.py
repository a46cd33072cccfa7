"""Configs of official model names built without the hub (loading.official_configs)."""

from __future__ import annotations

import pytest

from hooked.loading.official_configs import OFFICIAL_HF_CONFIGS, official_hf_config
from hooked.loading.pretrained import build_config


@pytest.mark.parametrize("name", sorted(OFFICIAL_HF_CONFIGS))
def test_every_listed_name_is_official_and_converts(name):
    from hooked.loading import OFFICIAL_MODEL_NAMES

    assert name in OFFICIAL_MODEL_NAMES
    hf = official_hf_config(name)
    cfg = build_config(hf, hf.architectures[0], name)
    assert cfg.d_head * cfg.n_heads == hf.num_attention_heads * hf.head_dim
    assert cfg.attn_types == ["global" if (i + 1) % 6 == 0 else "local" for i in range(cfg.n_layers)]
    assert (cfg.rotary_base, cfg.rotary_base_local) == (1_000_000, 10_000)


def test_unlisted_name_is_none():
    assert official_hf_config("gpt2") is None


def test_image_text_checkpoints_keep_their_vocabulary_and_window():
    four_b = official_hf_config("google/gemma-3-4b-it")
    assert (four_b.architectures, four_b.vocab_size, four_b.sliding_window) == (
        ["Gemma3ForConditionalGeneration"],
        262208,
        1024,
    )
    assert official_hf_config("google/medgemma-27b-text-it").vocab_size == 262144


def test_compat_config_needs_no_hub(monkeypatch):
    """TransformerLens's get_pretrained_model_config of a listed name: offline, n_ctx 8192 unless asked."""
    from hooked.compat.loading_from_pretrained import get_pretrained_model_config

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cfg = get_pretrained_model_config("gemma-3-1b-it")
    assert (cfg.model_name, cfg.n_layers, cfg.d_model, cfg.n_ctx) == ("google/gemma-3-1b-it", 26, 1152, 8192)
    assert get_pretrained_model_config("google/gemma-3-1b-it", n_ctx=32768).n_ctx == 32768


@pytest.mark.slow
def test_270m_entry_equals_the_bundled_checkpoint():
    """The table's Gemma-3-270M config converts to the same hooked config as the real checkpoint's."""
    from hooked.loading import bundled
    from hooked.loading.checkpoint import load_hf_config

    real = load_hf_config(bundled.bundled_checkpoint_dir("gemma-3-270m"))
    listed = official_hf_config("google/gemma-3-270m")
    assert build_config(listed, "Gemma3ForCausalLM", "g") == build_config(real, "Gemma3ForCausalLM", "g")
