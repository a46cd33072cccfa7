"""TransformerLens's T5 and HuBERT names: `convert_t5_weights`, `convert_hubert_weights`, `T5Attention`, `T5Block`.

The converters take an HF model (or any object with its attribute tree), as TransformerLens's
do, and run hooked's converters from `loading/t5.py` and `loading/hubert.py`.
"""

from __future__ import annotations

from hooked.compat.pretrained import _hf_tensors
from hooked.components.hubert import HubertBlock
from hooked.components.t5 import T5Attention, T5Block
from hooked.models.hooked_audio_encoder import HookedAudioEncoder
from hooked.models.hooked_encoder_decoder import HookedEncoderDecoder

__path__: list[str] = []

__all__ = [
    "HookedAudioEncoder",
    "HookedEncoderDecoder",
    "HubertBlock",
    "T5Attention",
    "T5Block",
    "convert_hubert_weights",
    "convert_t5_weights",
]


def convert_t5_weights(t5, cfg) -> dict:
    """TransformerLens's `convert_t5_weights(hf_model, cfg)`: a `T5ForConditionalGeneration` -> its state dict."""
    from hooked.loading.t5 import convert_t5_weights as convert

    return convert(_hf_tensors(t5), cfg)


def convert_hubert_weights(hf_model, cfg) -> dict:
    """TransformerLens's `convert_hubert_weights(hf_model, cfg)`: the transformer blocks of a `HubertModel`.

    As in TransformerLens, the front end is left out, absent biases are omitted, and the
    encoder's LayerNorm is returned as `ln_final` (hooked's `HookedAudioEncoder` calls it
    `encoder_ln`, since in HuBERT base it runs before the blocks).
    """
    from hooked.loading.hubert import block_weights

    if getattr(hf_model, "encoder", None) is None:
        raise ValueError("hf_model has no .encoder: pass a HubertModel (not a HubertForCTC's outer model)")
    tensors = _hf_tensors(hf_model)
    state = {}
    for layer in range(cfg.n_layers):
        state.update(block_weights(tensors, layer, cfg))
    if "encoder.layer_norm.weight" in tensors:
        state["ln_final.w"], state["ln_final.b"] = (
            tensors["encoder.layer_norm.weight"],
            tensors["encoder.layer_norm.bias"],
        )
    return state
