"""Loading HuggingFace (and GGUF) checkpoints into `hooked` configs and state dicts.

One module per architecture family registers a pure converter by HF class name;
`transformers` is imported only inside this package, and only when needed.
"""

from hooked.loading import apertus, cohere, falcon, gemma, gpt2, gpt_oss, granite, llama, moe, olmo, phi3, smollm3  # noqa: F401  (registers converters)
from hooked.loading import bloom, gpt_bigcode, gpt_neo, gpt_neox, gptj, opt, phi, stablelm, starcoder2  # noqa: F401
from hooked.loading import bert, distilbert, hubert, t5  # noqa: F401  (HookedEncoder / HookedAudioEncoder / HookedEncoderDecoder)
from hooked.loading.checkpoint import load_tokenizer
from hooked.loading.model_names import MODEL_ALIASES, OFFICIAL_MODEL_NAMES, get_official_model_name, hub_checkpoint_dir
from hooked.loading.pretrained import load_pretrained
from hooked.loading.registry import ARCHITECTURES, get_architecture, supported_architectures

__all__ = [
    "MODEL_ALIASES",
    "OFFICIAL_MODEL_NAMES",
    "get_official_model_name",
    "hub_checkpoint_dir",
    "ARCHITECTURES", "get_architecture", "load_pretrained", "load_tokenizer", "supported_architectures"]
