"""hooked: HuggingFace causal language models as hooked, readable transformer components.

`from hooked import HookedTransformer` is the entry point. The model classes load
lazily so that `components` (which builds on this package's primitives) imports on
its own without a cycle.
"""

from __future__ import annotations

import importlib

from hooked._version import __version__
from hooked.config import HookedTransformerConfig
from hooked.hook_points import HookedRootModule, HookNotEnabledError, HookPoint, HookShapeError, LensHandle
from hooked.utils import get_act_name

_LAZY = {
    "HookedTransformer": ("hooked.hooked_transformer", "HookedTransformer"),
    "HookedEncoder": ("hooked.hooked_encoder", "HookedEncoder"),
    "BertNextSentencePrediction": ("hooked.next_sentence_prediction", "BertNextSentencePrediction"),
    "ActivationCache": ("hooked.activation_cache", "ActivationCache"),
    "FactoredMatrix": ("hooked.factored_matrix", "FactoredMatrix"),
    "HookedTransformerKeyValueCache": ("hooked.past_key_value_caching", "HookedTransformerKeyValueCache"),
}
_LAZY["HookedEncoderDecoder"] = ("hooked.hooked_encoder_decoder", "HookedEncoderDecoder")  # T5
_LAZY["HookedAudioEncoder"] = ("hooked.hooked_audio_encoder", "HookedAudioEncoder")  # HuBERT


def __getattr__(name: str):
    if name in _LAZY:
        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'hooked' has no attribute {name!r}")


__all__ = [
    "ActivationCache",
    "BertNextSentencePrediction",
    "HookedEncoder",
    "FactoredMatrix",
    "HookNotEnabledError",
    "HookPoint",
    "HookShapeError",
    "HookedRootModule",
    "HookedTransformer",
    "HookedTransformerConfig",
    "HookedTransformerKeyValueCache",
    "LensHandle",
    "get_act_name",
]
__all__ += ["HookedAudioEncoder", "HookedEncoderDecoder", "__version__"]
