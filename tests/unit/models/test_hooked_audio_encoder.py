"""HookedAudioEncoder: waveform normalization as HF's feature extractor, TL-style construction, refusals."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hooked.models.hooked_audio_encoder import HookedAudioEncoder, normalize_waveforms
from tests.tiny_models import tiny_hubert
from tests.unit.components.test_hubert import hubert_cfg


def test_normalization_equals_hf_feature_extractor():
    from transformers import Wav2Vec2FeatureExtractor

    g = np.random.default_rng(0)
    waves = [g.normal(0.3, 2.0, n).astype(np.float32) for n in (800, 523)]
    fe = Wav2Vec2FeatureExtractor(do_normalize=True, return_attention_mask=True)
    theirs = fe(waves, sampling_rate=16000, return_tensors="pt", padding=True)
    batch = torch.zeros(2, 800)
    batch[0], batch[1, :523] = torch.from_numpy(waves[0]), torch.from_numpy(waves[1])
    ours = normalize_waveforms(batch, theirs["attention_mask"])
    torch.testing.assert_close(ours, theirs["input_values"], atol=1e-5, rtol=0)
    torch.testing.assert_close(normalize_waveforms(batch[:1]), theirs["input_values"][:1], atol=1e-5, rtol=0)


def test_checkpoint_preprocessor_config_turns_normalization_on(tmp_path):
    from transformers import Wav2Vec2FeatureExtractor

    hf = tiny_hubert(1)
    hf.save_pretrained(tmp_path)
    Wav2Vec2FeatureExtractor(do_normalize=True).save_pretrained(tmp_path)
    model = HookedAudioEncoder.from_pretrained(str(tmp_path))
    wave = 0.1 * torch.randn(1, 700) + 0.05
    with torch.no_grad():
        ref = hf(normalize_waveforms(wave)).last_hidden_state
        ours = model(wave)
    assert model.normalize_waveforms
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=0)


def test_config_only_model_runs_on_frames_and_refuses_waveforms():
    model = HookedAudioEncoder(hubert_cfg())
    frames = torch.randn(2, 9, 32)
    with pytest.raises(ValueError, match="front end"):
        model(frames)  # no positional convolution either
    with pytest.raises(ValueError, match="front end"):
        model(torch.randn(2, 400))


def test_other_sampling_rates_are_refused():
    model = HookedAudioEncoder.from_pretrained("tiny", hf_model=tiny_hubert(2))
    with pytest.raises(ValueError, match="16 kHz"):
        model(torch.randn(1, 400), sampling_rate=8000)


def test_weight_views_and_head_labels():
    model = HookedAudioEncoder.from_pretrained("tiny", hf_model=tiny_hubert(3))
    assert model.W_Q.shape == (2, 4, 32, 8) and model.b_O.shape == (2, 32)
    assert model.QK.shape == (2, 4, 32, 32)
    assert model.all_head_labels()[-1] == "L1H3"


def test_hooked_transformer_names_the_class_for_hubert(tmp_path):
    from hooked import HookedTransformer

    tiny_hubert(0).save_pretrained(tmp_path)
    with pytest.raises(NotImplementedError, match="HookedAudioEncoder"):
        HookedTransformer.from_pretrained(str(tmp_path))
