"""The `transformer_lens` package namespace, as TransformerLens 2.x's `__init__` exposes it."""

from __future__ import annotations

from hooked import head_detector, hook_points, patching
from hooked.compat import utils
from hooked.compat import loading_from_pretrained
from hooked.compat import loading_from_pretrained as loading
from hooked.activation_cache import ActivationCache
from hooked.compat import components, evals, factories
from hooked.config import HookedTransformerConfig
from hooked.factored_matrix import FactoredMatrix
from hooked.hooked_transformer import HookedTransformer
from hooked.hooked_encoder import HookedEncoder
from hooked.next_sentence_prediction import BertNextSentencePrediction
from hooked.past_key_value_caching import HookedTransformerKeyValueCache, HookedTransformerKeyValueCacheEntry

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
from hooked.hooked_audio_encoder import HookedAudioEncoder  # noqa: E402
from hooked.hooked_encoder_decoder import HookedEncoderDecoder  # noqa: E402

__all__ += ["HookedAudioEncoder", "HookedEncoderDecoder"]
