"""TransformerLens paths for T5 and HuBERT: the model classes, the converters, the T5 components."""

from __future__ import annotations

import importlib
import sys

import pytest
import torch

from hooked.compat import alias_transformer_lens, unalias_transformer_lens
from hooked.models.hooked_audio_encoder import HookedAudioEncoder
from hooked.models.hooked_encoder_decoder import HookedEncoderDecoder
from tests.tiny_models import tiny_hubert, tiny_t5


@pytest.fixture(scope="module")
def tl():
    already = "transformer_lens" in sys.modules  # another test module aliased at import: leave it so
    alias_transformer_lens(strict=True)
    yield importlib.import_module("transformer_lens")
    if not already:
        unalias_transformer_lens()


def test_model_classes_resolve_to_hooked(tl):
    assert tl.HookedEncoderDecoder is HookedEncoderDecoder
    assert tl.HookedAudioEncoder is HookedAudioEncoder
    from transformer_lens.components import T5Attention, T5Block

    import hooked.components.t5

    assert (T5Attention, T5Block) == (hooked.components.t5.T5Attention, hooked.components.t5.T5Block)


def test_convert_t5_weights_loads_strictly(tl):
    from transformer_lens.pretrained.weight_conversions.t5 import convert_t5_weights

    hf = tiny_t5(0)
    model = HookedEncoderDecoder.from_pretrained("tiny", hf_model=hf)
    state = convert_t5_weights(hf, model.cfg)
    assert set(state) == set(model.state_dict())
    for key, value in state.items():
        assert torch.equal(value, model.state_dict()[key]), key


def test_convert_hubert_weights_gives_the_transformer_with_ln_final(tl):
    from transformer_lens.pretrained.weight_conversions.hubert import convert_hubert_weights

    hf = tiny_hubert(0)
    model = HookedAudioEncoder.from_pretrained("tiny", hf_model=hf)
    state = convert_hubert_weights(hf, model.cfg)
    blocks = {k: v for k, v in model.state_dict().items() if k.startswith("blocks.")}
    assert set(state) == set(blocks) | {"ln_final.w", "ln_final.b"}
    for key, value in blocks.items():
        assert torch.equal(state[key], value), key
    assert torch.equal(state["ln_final.w"], model.encoder_ln.w)
