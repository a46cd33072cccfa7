"""hooked: HuggingFace language models as hooked, readable transformer components.

`from hooked import HookedTransformer` is the entry point. The package is layered, each
layer importing only those below it (tests/unit/project/test_import_layers.py checks this):

    core  <-  components  <-  processing, placement  <-  loading  <-  analysis  <-  generation
          <-  models  <-  circuits, harvest  <-  viz  <-  scale  <-  serve, remote  <-  compat, cli

Importing `hooked` registers what plugs into the models through their seams (`hooked.scale`).
"""

from __future__ import annotations

from hooked import _moved_modules
from hooked._version import __version__
from hooked.analysis.activation_cache import ActivationCache
from hooked.compat import nnsight_observer as _nnsight_observer  # noqa: F401  (registers the tracer observer)
from hooked.core.config import HookedTransformerConfig
from hooked.core.factored_matrix import FactoredMatrix
from hooked.core.hook_points import HookedRootModule, HookNotEnabledError, HookPoint, HookShapeError, LensHandle
from hooked.core.utils import get_act_name
from hooked.generation.kv_cache import HookedTransformerKeyValueCache
from hooked.models.hooked_audio_encoder import HookedAudioEncoder  # HuBERT
from hooked.models.hooked_encoder import HookedEncoder
from hooked.models.hooked_encoder_decoder import HookedEncoderDecoder  # T5
from hooked.models.hooked_transformer import HookedTransformer
from hooked.models.next_sentence_prediction import BertNextSentencePrediction
from hooked.models.vision_language import HookedVisionLanguageModel  # LLaVA, Gemma 3 with images

_moved_modules.install()
# hooked.scale plugs into the model through its seams (the `pipeline=True` loader) when imported
from hooked import scale  # noqa: E402, F401

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
    "HookedVisionLanguageModel",
    "LensHandle",
    "__version__",
    "get_act_name",
]
