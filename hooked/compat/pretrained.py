"""`transformer_lens.pretrained(.weight_conversions.*)`: HF model -> TransformerLens state dict.

In `hooked` each family's converter lives in `loading/<family>.py` and reads an HF state
dict; these names take an HF model, as TransformerLens's do, and use that converter.
A family `hooked` does not convert raises the registry's error naming the supported ones.
"""

from __future__ import annotations

__path__: list[str] = []

# TransformerLens converter module -> the HF class whose hooked converter does the job
FAMILIES = {
    "apertus": "ApertusForCausalLM",
    "bloom": "BloomForCausalLM",
    "gemma": "GemmaForCausalLM",
    "gpt2": "GPT2LMHeadModel",
    "gptj": "GPTJForCausalLM",
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "mixtral": "MixtralForCausalLM",
    "neo": "GPTNeoForCausalLM",
    "neox": "GPTNeoXForCausalLM",
    "gpt_oss": "GptOssForCausalLM",
    "opt": "OPTForCausalLM",
    "phi": "PhiForCausalLM",
    "phi3": "Phi3ForCausalLM",
    "qwen": "QWenLMHeadModel",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}
MODULES = {"openai": "gpt_oss"}  # TransformerLens module names that differ from the family


def _converter(family: str):
    def convert(hf_model, cfg):
        from loading.registry import get_architecture

        if family == "gemma" and cfg.embed_scale is None:  # TransformerLens's Gemma converter scales W_E by sqrt(d)
            cfg = cfg.replace(embed_scale=cfg.d_model**0.5)
        return get_architecture(FAMILIES[family]).weights(hf_model.state_dict(), cfg)

    convert.__name__ = convert.__qualname__ = f"convert_{family}_weights"
    convert.__doc__ = f"TransformerLens's `convert_{family}_weights(hf_model, cfg)`, through hooked's converter."
    return convert


globals().update({f"convert_{family}_weights": _converter(family) for family in FAMILIES})
