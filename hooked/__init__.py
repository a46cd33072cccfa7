"""hooked: HuggingFace language models as hooked, readable transformer components.

`from hooked import HookedTransformer` is the entry point. The package is layered, each
layer importing only those below it (tests/unit/project/test_import_layers.py checks this):

    core  <-  components  <-  processing, placement  <-  loading  <-  analysis  <-  generation
          <-  models  <-  circuits, harvest  <-  viz  <-  scale  <-  serve, remote  <-  compat, cli

The model classes load on first use, so `import hooked` stays light.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from hooked import _moved_modules
from hooked._version import __version__
from hooked.core.config import HookedTransformerConfig
from hooked.core.hook_points import HookedRootModule, HookNotEnabledError, HookPoint, HookShapeError, LensHandle
from hooked.core.utils import get_act_name

_moved_modules.install()
# hooked.scale plugs into the model through its seams (the `pipeline=True` loader) when imported
from hooked import scale  # noqa: E402, F401

_LAZY = {
    "HookedTransformer": ("hooked.models.hooked_transformer", "HookedTransformer"),
    "HookedEncoder": ("hooked.models.hooked_encoder", "HookedEncoder"),
    "BertNextSentencePrediction": ("hooked.models.next_sentence_prediction", "BertNextSentencePrediction"),
    "HookedEncoderDecoder": ("hooked.models.hooked_encoder_decoder", "HookedEncoderDecoder"),  # T5
    "HookedAudioEncoder": ("hooked.models.hooked_audio_encoder", "HookedAudioEncoder"),  # HuBERT
    "ActivationCache": ("hooked.analysis.activation_cache", "ActivationCache"),
    "FactoredMatrix": ("hooked.core.factored_matrix", "FactoredMatrix"),
    "HookedTransformerKeyValueCache": ("hooked.generation.kv_cache", "HookedTransformerKeyValueCache"),
}

if TYPE_CHECKING:  # what a type checker sees for the lazy names above
    from hooked.analysis.activation_cache import ActivationCache
    from hooked.core.factored_matrix import FactoredMatrix
    from hooked.generation.kv_cache import HookedTransformerKeyValueCache
    from hooked.models.hooked_audio_encoder import HookedAudioEncoder
    from hooked.models.hooked_encoder import HookedEncoder
    from hooked.models.hooked_encoder_decoder import HookedEncoderDecoder
    from hooked.models.hooked_transformer import HookedTransformer
    from hooked.models.next_sentence_prediction import BertNextSentencePrediction


def __getattr__(name: str):
    if name in _LAZY:
        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'hooked' has no attribute {name!r}")


__all__ = [
    "ActivationCache",
    "BertNextSentencePrediction",
    "FactoredMatrix",
    "HookNotEnabledError",
    "HookPoint",
    "HookShapeError",
    "HookedAudioEncoder",
    "HookedEncoder",
    "HookedEncoderDecoder",
    "HookedRootModule",
    "HookedTransformer",
    "HookedTransformerConfig",
    "HookedTransformerKeyValueCache",
    "LensHandle",
    "__version__",
    "get_act_name",
]
