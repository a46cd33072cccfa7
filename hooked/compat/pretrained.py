"""`transformer_lens.pretrained(.weight_conversions.*)`: HF model -> TransformerLens state dict.

In `hooked` each family's converter lives in `loading/<family>.py` and reads an HF state
dict; these names take an HF model, as TransformerLens's do, and use that converter.
A family `hooked` does not convert raises the registry's error naming the supported ones.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

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


class ModuleTreeTensors(Mapping):
    """An HF model's tensors by state-dict key, read by walking its attributes (`model.layers.0.self_attn...`).

    TransformerLens's converters take the model object and read attributes, so its users
    (and its tests) may pass objects that have the attribute tree but no `state_dict()`.
    A key resolves only to a tensor; anything else (a missing or non-tensor attribute) is
    absent. Keys cannot be listed, so converters must ask for the keys they need.
    """

    def __init__(self, model):
        self.model = model

    def __getitem__(self, key: str) -> torch.Tensor:
        node = self.model
        for part in key.split("."):
            try:
                node = node[int(part)] if part.isdigit() else getattr(node, part, None)
            except (IndexError, TypeError):
                node = None
            if node is None:
                raise KeyError(key)
        if not isinstance(node, torch.Tensor):
            raise KeyError(key)
        return node

    def __contains__(self, key) -> bool:
        try:
            self[key]
        except KeyError:
            return False
        return True

    def __iter__(self):
        raise TypeError("ModuleTreeTensors cannot list its keys; ask for a key")

    def __len__(self) -> int:
        raise TypeError("ModuleTreeTensors cannot count its keys")


def _hf_tensors(hf_model) -> Mapping[str, torch.Tensor]:
    """A real module's state dict, or its attribute tree for objects without one."""
    return hf_model.state_dict() if isinstance(hf_model, torch.nn.Module) else ModuleTreeTensors(hf_model)


def _converter(family: str):
    def convert(hf_model, cfg):
        from hooked.loading.registry import get_architecture

        if family == "gemma" and cfg.embed_scale is None:  # TransformerLens's Gemma converter scales W_E by sqrt(d)
            cfg = cfg.replace(embed_scale=cfg.d_model**0.5)
        return get_architecture(FAMILIES[family]).weights(_hf_tensors(hf_model), cfg)

    convert.__name__ = convert.__qualname__ = f"convert_{family}_weights"
    convert.__doc__ = f"TransformerLens's `convert_{family}_weights(hf_model, cfg)`, through hooked's converter."
    return convert


globals().update({f"convert_{family}_weights": _converter(family) for family in FAMILIES})


def convert_bert_weights(bert, cfg) -> dict[str, torch.Tensor]:
    """TransformerLens's `convert_bert_weights(hf_model, cfg)` (a `BertForPreTraining`), through hooked's converter."""
    from hooked.loading.bert import convert_bert_weights as convert

    return convert(_hf_tensors(bert), cfg)
