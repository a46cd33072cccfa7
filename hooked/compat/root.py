"""The `transformer_lens` package namespace, as TransformerLens 2.x's `__init__` exposes it."""

from __future__ import annotations

from hooked.analysis import head_detector, patching
from hooked.analysis.activation_cache import ActivationCache
from hooked.compat import components, evals, factories, loading_from_pretrained, utils
from hooked.compat import loading_from_pretrained as loading
from hooked.core import hook_points
from hooked.core.config import HookedTransformerConfig
from hooked.core.factored_matrix import FactoredMatrix
from hooked.generation.kv_cache import HookedTransformerKeyValueCache, HookedTransformerKeyValueCacheEntry
from hooked.models.hooked_encoder import HookedEncoder
from hooked.models.hooked_transformer import HookedTransformer
from hooked.models.next_sentence_prediction import BertNextSentencePrediction

# TransformerLens's legacy names
EasyTransformer = HookedTransformer
EasyTransformerConfig = HookedTransformerConfig
EasyTransformerKeyValueCache = HookedTransformerKeyValueCache
EasyTransformerKeyValueCacheEntry = HookedTransformerKeyValueCacheEntry

__path__: list[str] = []  # a package: submodules resolve through sys.modules only
__version__ = "2.18.0"

__all__ = [
    "BertNextSentencePrediction",
    "HookedEncoder",
    "ActivationCache",
    "EasyTransformer",
    "EasyTransformerConfig",
    "EasyTransformerKeyValueCache",
    "EasyTransformerKeyValueCacheEntry",
    "FactoredMatrix",
    "HookedTransformer",
    "HookedTransformerConfig",
    "HookedTransformerKeyValueCache",
    "HookedTransformerKeyValueCacheEntry",
    "components",
    "evals",
    "factories",
    "head_detector",
    "hook_points",
    "loading",
    "loading_from_pretrained",
    "patching",
    "utils",
]

# encoders and encoder-decoders (T5, HuBERT)
from hooked.models.hooked_audio_encoder import HookedAudioEncoder  # noqa: E402
from hooked.models.hooked_encoder_decoder import HookedEncoderDecoder  # noqa: E402

__all__ += ["HookedAudioEncoder", "HookedEncoderDecoder"]
