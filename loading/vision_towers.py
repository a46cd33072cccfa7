"""Converter pieces shared by the image-text families: the ViT (CLIP or SigLIP) and the language model inside.

An image-text checkpoint holds three models under prefixes that moved between transformers
versions: the vision tower (`model.vision_tower.`, on disk `vision_tower.`, older hub files
`vision_tower.vision_model.`), the projector and the language model (`model.language_model.`
and `lm_head.`, on disk `language_model.model.` and `language_model.lm_head.`). The language
model is converted by its own family's converter (`TextView` shows it the keys it expects);
the ViT's blocks become `vision.blocks.{i}` of ordinary pre-LN `TransformerBlock`s:

    CLIP:    x = cat(class, conv(pixels)) + pos;  x = pre_layrnorm(x)
    SigLIP:  x = conv(pixels) + b + pos
    per layer:  x += out_proj(attention(layer_norm1(x)));  x += fc2(act(fc1(layer_norm2(x))))
    SigLIP's `post_layernorm` normalizes the last hidden state (Gemma 3 reads it; LLaVA-OneVision does not)

Only the blocks up to the deepest feature layer are converted: later ones cannot change what
the language model reads. SigLIP's attention-pooling head is never read by these models.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch

from hooked.loading.config_checks import require_activation, require_supported
from hooked.loading.parts import dense_mlp, layer_norm, prefixed, projections
from hooked.loading.registry import get_architecture

#: ViT kinds by HF `model_type`: (class token and pre-norm as CLIP, patch-embedding bias as SigLIP)
VISION_TOWERS = {
    "clip_vision_model": dict(class_token=True, pre_norm=True, patch_bias=False),
    "siglip_vision_model": dict(class_token=False, pre_norm=False, patch_bias=True),
}
#: language models inside image-text checkpoints, by HF `model_type`, and the converter's class name
TEXT_MODELS = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen2_5_vl_text": "Qwen2ForCausalLM",  # Qwen2.5-VL's: Qwen2's, its M-RoPE read by the image-text model
}

_VISION_PREFIXES = (
    "model.vision_tower.vision_model.",
    "vision_tower.vision_model.",
    "model.vision_tower.",
    "vision_tower.",
)
_TEXT_PREFIXES = ("model.language_model.", "language_model.model.", "model.")
_LM_HEADS = ("lm_head.weight", "language_model.lm_head.weight")


def first_prefix(state: Mapping[str, torch.Tensor], prefixes: Sequence[str], probe: str) -> str:
    """The first of `prefixes` under which `probe` exists (a KeyError naming them all when none does)."""
    for prefix in prefixes:
        if prefix + probe in state:
            return prefix
    raise KeyError(f"no tensor {probe!r} under any of the prefixes {list(prefixes)}")


def resolve_feature_layers(selected: int | Sequence[int], n_layers: int) -> tuple[int, ...]:
    """HF's `vision_feature_layer` (an index into the `n_layers + 1` hidden states, maybe negative) as >= 0."""
    layers = [selected] if isinstance(selected, int) else list(selected)
    n_states = n_layers + 1
    bad = [i for i in layers if not -n_states <= i < n_states]
    if bad:
        raise ValueError(f"vision_feature_layer {bad} is outside the ViT's {n_states} hidden states")
    return tuple(i % n_states for i in layers)


# -- config -----------------------------------------------------------------------------------


def vision_tower_config(hf_vision: Any, family: str, feature_layers: tuple[int, ...], post_norm: bool) -> dict:
    """`VisionLanguageConfig` fields of the ViT: its blocks (as a `HookedTransformerConfig` dict) and patching."""
    kind = require_supported(hf_vision, family, "model_type", tuple(VISION_TOWERS))
    act = require_activation(hf_vision, "hidden_act", family, path="vision_config.hidden_act")
    d_model, n_heads = hf_vision.hidden_size, hf_vision.num_attention_heads
    n_patches = (hf_vision.image_size // hf_vision.patch_size) ** 2
    n_blocks = max(feature_layers)  # hidden state i is block i's output (0: the embeddings)
    blocks = dict(
        d_model=d_model, d_head=d_model // n_heads, n_heads=n_heads, n_layers=n_blocks,
        n_ctx=n_patches + int(VISION_TOWERS[kind]["class_token"]), d_mlp=hf_vision.intermediate_size, act_fn=act,
        normalization_type="LN", eps=hf_vision.layer_norm_eps, attention_dir="bidirectional",
        original_architecture={"clip_vision_model": "CLIPVisionModel"}.get(kind, "SiglipVisionModel"),
        init_weights=False,
    )  # fmt: skip
    return dict(
        vision=blocks,
        image_size=hf_vision.image_size,
        patch_size=hf_vision.patch_size,
        num_channels=getattr(hf_vision, "num_channels", 3),
        feature_layers=feature_layers,
        post_norm=post_norm and n_blocks == hf_vision.num_hidden_layers,
        **VISION_TOWERS[kind],
    )


def text_model_config(hf_text: Any, family: str) -> tuple[str, dict]:
    """The language model's converter class name and its `HookedTransformerConfig` fields."""
    model_type = require_supported(hf_text, family, "model_type", tuple(TEXT_MODELS))
    name = TEXT_MODELS[model_type]
    return name, get_architecture(name).config(hf_text)


# -- weights ----------------------------------------------------------------------------------


class TextView(Mapping):
    """The language model's tensors under the keys its own converter reads (`model.*`, `lm_head.weight`)."""

    def __init__(self, state: Mapping[str, torch.Tensor]):
        self.state = state
        self.prefix = first_prefix(state, _TEXT_PREFIXES, "embed_tokens.weight")
        self.lm_head = next((k for k in _LM_HEADS if k in state), None)

    def _key(self, key: str) -> str:
        if key == "lm_head.weight" and self.lm_head is not None:
            return self.lm_head
        return self.prefix + key.removeprefix("model.")

    def __getitem__(self, key: str) -> torch.Tensor:
        return self.state[self._key(key)]

    def __contains__(self, key) -> bool:
        return (key != "lm_head.weight" or self.lm_head is not None) and self._key(key) in self.state

    def __iter__(self) -> Iterator[str]:
        return (k for k in ("lm_head.weight",) if k in self)

    def __len__(self) -> int:
        return len(self.state)


def text_model_weights(state: Mapping[str, torch.Tensor], cfg, text_class: str) -> dict[str, torch.Tensor]:
    """The language model's TransformerLens tensors (`embed.W_E`, `blocks.{l}.*`, `unembed.*`), by its converter."""
    return get_architecture(text_class).weights(TextView(state), cfg)


def vision_tower_weights(state: Mapping[str, torch.Tensor], vcfg) -> dict[str, torch.Tensor]:
    """`vision.*`: the patch embedding, positions, class token, norms and the blocks that are built."""
    p = first_prefix(state, _VISION_PREFIXES, "embeddings.patch_embedding.weight")
    cfg, d = vcfg.vision, vcfg.vision.d_model
    sd = {
        "embed.W_patch": state[p + "embeddings.patch_embedding.weight"],  # [d_model, channels, patch, patch]
        "embed.W_pos": state[p + "embeddings.position_embedding.weight"],  # [positions, d_model]
    }
    if vcfg.patch_bias:
        sd["embed.b_patch"] = state[p + "embeddings.patch_embedding.bias"]  # [d_model]
    if vcfg.class_token:
        sd["embed.class_embed"] = state[p + "embeddings.class_embedding"]  # [d_model]
    if vcfg.pre_norm:
        sd.update(layer_norm(state, p + "pre_layrnorm", "ln_pre", d))
    if vcfg.post_norm:
        sd.update(layer_norm(state, p + "post_layernorm", "ln_post", d))
    for layer in range(cfg.n_layers):
        hf = f"{p}encoder.layers.{layer}."
        block = {
            **layer_norm(state, hf + "layer_norm1", "ln1", d),
            **layer_norm(state, hf + "layer_norm2", "ln2", d),
            **projections(state, hf + "self_attn.", ("q_proj", "k_proj", "v_proj", "out_proj"), cfg),
            **dense_mlp(state, hf + "mlp.fc1", hf + "mlp.fc2"),
        }
        sd.update(prefixed(f"blocks.{layer}.", block))
    return prefixed("vision.", sd)
