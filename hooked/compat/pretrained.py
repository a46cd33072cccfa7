"""`transformer_lens.pretrained(.weight_conversions)`: HF -> TransformerLens state-dict converters.

In `hooked` each family's converter lives in `loading/<family>.py` and reads an HF state
dict; these names take a HF model as TransformerLens's do.
"""

from __future__ import annotations

__path__: list[str] = []


def _converter(hf_class: str):
    def convert(hf_model, cfg):
        from loading.registry import get_architecture

        return get_architecture(hf_class).weights(hf_model.state_dict(), cfg)

    convert.__name__ = f"convert_{hf_class}_weights"
    return convert


convert_gpt2_weights = _converter("GPT2LMHeadModel")
convert_llama_weights = _converter("LlamaForCausalLM")
convert_mistral_weights = _converter("MistralForCausalLM")
convert_qwen2_weights = _converter("Qwen2ForCausalLM")
convert_qwen3_weights = _converter("Qwen3ForCausalLM")
