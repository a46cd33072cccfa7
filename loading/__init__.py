"""Loading HuggingFace (and GGUF) checkpoints into `hooked` configs and state dicts.

One module per architecture family registers a pure converter by HF class name;
`transformers` is imported only inside this package, and only when needed.
"""

from hooked.loading import (  # noqa: F401  (registers converters)  # noqa: F401  # noqa: F401  (HookedEncoder / HookedAudioEncoder / HookedEncoderDecoder)
    apertus,
    bert,
    bloom,
    codegen,
    cohere,
    deepseek,
    distilbert,
    falcon,
    gemma,
    gemma3_multimodal,
    gemma3n,
    gemma4,
    glm4_moe,
    glm_moe_dsa,
    gpt2,
    gpt_bigcode,
    gpt_neo,
    gpt_neox,
    gpt_oss,
    gptj,
    granite,
    granite_hybrid,
    granitemoe,
    hubert,
    hunyuan,
    lfm2,
    llama,
    llava,
    mamba,
    moe,
    mpt,
    nemotron_h,
    olmo,
    opt,
    phi,
    phi3,
    phimoe,
    qwen2_5_vl,
    qwen3_next,
    smollm3,
    stablelm,
    starcoder2,
    t5,
    xglm,
)
from hooked.loading.checkpoint import load_tokenizer
from hooked.loading.model_names import MODEL_ALIASES, OFFICIAL_MODEL_NAMES, get_official_model_name, hub_checkpoint_dir
from hooked.loading.pretrained import load_pretrained
from hooked.loading.registry import ARCHITECTURES, get_architecture, supported_architectures

__all__ = [
    "MODEL_ALIASES",
    "OFFICIAL_MODEL_NAMES",
    "get_official_model_name",
    "hub_checkpoint_dir",
    "ARCHITECTURES",
    "get_architecture",
    "load_pretrained",
    "load_tokenizer",
    "supported_architectures",
]
