"""HuBERT (`HookedAudioEncoder`) against HuggingFace eager, float32.

Tiny random `HubertModel`s, every parameter redrawn (the positional convolution's weight-norm
`g` and `v` included), saved to disk and loaded from there: the base layout (GroupNorm front
end, post-LN blocks, even positional kernel) and the large layout (LayerNorm front end with
conv biases, pre-LN "stable" blocks with a final LayerNorm, odd kernel).
"""

from __future__ import annotations

import pytest
import torch

from hooked.models.hooked_audio_encoder import HookedAudioEncoder
from tests.helpers import max_abs
from tests.tiny_models import tiny_hubert

ATOL = 1e-5
HF_CLASSES = ("HubertModel",)

CONFIGS = {
    "hubert_base_layout": dict(),
    "hubert_large_layout": dict(
        do_stable_layer_norm=True, feat_extract_norm="layer", conv_bias=True, num_conv_pos_embeddings=7
    ),
}


@pytest.fixture(params=list(CONFIGS), scope="module")
def pair(request, tmp_path_factory):
    hf = tiny_hubert(len(request.param), **CONFIGS[request.param])
    path = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(path)
    return hf, HookedAudioEncoder.from_pretrained(str(path))


def waveforms(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    waves = torch.randn(3, 800, generator=g)
    mask = torch.ones(3, 800, dtype=torch.long)
    mask[1, 520:], mask[2, 300:] = 0, 0
    return waves * mask, mask  # padding samples are zeros, as HF's feature extractor pads


def test_parity_suite_covers_hubert():
    from hooked import loading

    assert {type(tiny_hubert(0)).__name__} == set(HF_CLASSES)
    assert {name: loading.registry.MODEL_CLASS_ARCHITECTURES[name][0] for name in HF_CLASSES} == dict.fromkeys(
        HF_CLASSES, "HookedAudioEncoder"
    )


def test_hidden_states_and_every_block_output_match_hf(pair):
    hf, model = pair
    waves, mask = waveforms()
    outputs = []
    handles = [
        layer.register_forward_hook(lambda m, i, o: outputs.append(o[0] if isinstance(o, tuple) else o))
        for layer in hf.encoder.layers
    ]
    try:
        with torch.no_grad():
            ref = hf(waves, attention_mask=mask, output_hidden_states=True)
    finally:
        for h in handles:
            h.remove()
    with torch.no_grad():
        out, cache = model.run_with_cache(waves, one_zero_attention_mask=mask)
        fast = model(waves, one_zero_attention_mask=mask)
    assert max_abs(ref.last_hidden_state, out) < ATOL
    assert max_abs(ref.last_hidden_state, fast) < ATOL  # the fused attention path too
    assert max_abs(ref.hidden_states[0], cache["blocks.0.hook_resid_pre"]) < ATOL  # what enters the blocks
    # a block's output: hook_resid_post (pre-LN, stable layout) or the post-LN hook_normalized_resid_post
    name = "hook_resid_post" if model.stable_layer_norm else "hook_normalized_resid_post"
    assert len(outputs) == model.cfg.n_layers == 2
    for layer_i, hf_out in enumerate(outputs):
        assert max_abs(hf_out, cache[f"blocks.{layer_i}.{name}"]) < ATOL, layer_i


def test_front_end_matches_hf(pair):
    hf, model = pair
    waves, mask = waveforms(1)
    with torch.no_grad():
        features = hf.feature_extractor(waves).transpose(1, 2)
        frames, frame_mask = model.to_frames(waves, one_zero_attention_mask=mask)
        projected = hf.feature_projection(features)
        ref_mask = hf._get_feature_vector_attention_mask(features.shape[1], mask)
    assert max_abs(projected, frames) < ATOL
    assert torch.equal(ref_mask.long(), frame_mask)


def test_padded_batch_equals_waveforms_alone(pair):
    """With a LayerNorm front end, padding changes nothing. The base layout's first GroupNorm
    normalizes each channel over the whole padded length (HF documents this: such models are
    run unpadded or padded without a mask), so there the padded rows equal HF's padded rows."""
    hf, model = pair
    waves, mask = waveforms(2)
    with torch.no_grad():
        batched = model(waves, one_zero_attention_mask=mask)
        hf_batched = hf(waves, attention_mask=mask).last_hidden_state
        _, frame_mask = model.to_frames(waves, one_zero_attention_mask=mask)
        for row in range(waves.shape[0]):
            wave = waves[row : row + 1, : int(mask[row].sum())]
            alone = model(wave)
            n = int(frame_mask[row].sum())
            assert alone.shape[1] == n
            assert max_abs(hf(wave).last_hidden_state, alone) < ATOL, row
            expected = alone[0] if model.audio_cfg.feat_extract_norm == "layer" else hf_batched[row, :n]
            assert max_abs(batched[row, :n], expected) < ATOL, row


def test_list_of_waveforms_is_padded_and_masked(pair):
    _, model = pair
    waves, mask = waveforms(3)
    lengths = mask.sum(-1).tolist()
    with torch.no_grad():
        from_list = model([waves[i, :n] for i, n in enumerate(lengths)])
        from_tensor = model(waves, one_zero_attention_mask=mask)
    assert torch.equal(from_list, from_tensor)


def test_ablating_a_head_changes_only_through_its_pattern(pair):
    _, model = pair
    waves, _ = waveforms(4)

    def zero_head(z, hook):
        z[:, :, 0] = 0.0
        return z

    with torch.no_grad():
        clean = model(waves)
        ablated = model.run_with_hooks(waves, fwd_hooks=[("blocks.1.attn.hook_z", zero_head)])
        _, cache = model.run_with_cache(waves)
    pattern = cache["blocks.0.attn.hook_pattern"]
    assert pattern.shape == (3, model.cfg.n_heads, clean.shape[1], clean.shape[1])
    torch.testing.assert_close(pattern.sum(-1), torch.ones_like(pattern[..., 0]), atol=1e-5, rtol=0)
    assert max_abs(clean, ablated) > 1e-3
