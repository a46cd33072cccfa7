"""LLaVA, LLaVA-NeXT and LLaVA-OneVision: a ViT, an MLP projector and a LLaMA/Mistral/Qwen2 language model.

    features = cat(ViT hidden states at vision_feature_layer)    # CLIP (LLaVA, NeXT) or SigLIP (OneVision)
    features = features[:, 1:]  if vision_feature_select_strategy == "default"   (drops CLIP's class token)
    image    = linear_2(act(linear_1(features)))                   # the projector, per patch
    NeXT/OneVision: the base tile's tokens, then the any-resolution grid unpadded, `image_newline` after each row
    x = embed_tokens(tokens);  x[tokens == image_token_id] = image (in order)
    logits = the language model on x

The language model is converted by its own family's converter (`hooked.loading.llama`); the ViT
by `hooked.loading.vision_towers`. The projector's two linears become `projector.W_in`/`W_out`
and `image_newline` becomes `projector.image_newline`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from hooked.loading.common import bias_or_zeros
from hooked.loading.config_checks import require_activation, require_supported
from hooked.loading.registry import register_architecture
from hooked.loading.vision_towers import (
    first_prefix,
    resolve_feature_layers,
    text_model_config,
    text_model_weights,
    vision_tower_config,
    vision_tower_weights,
)

_PROJECTOR_PREFIXES = ("model.multi_modal_projector.", "multi_modal_projector.")
_NEWLINE_KEYS = ("model.image_newline", "image_newline")


# -- config -----------------------------------------------------------------------------------


def _llava_config(hf: Any, architecture: str) -> dict:
    """The fields every LLaVA variant shares: the language model's, and the ViT, projector and image token."""
    require_supported(hf, architecture, "vision_feature_select_strategy", ("default", "full"))
    text_class, fields = text_model_config(hf.text_config, architecture)
    layers = resolve_feature_layers(hf.vision_feature_layer, hf.vision_config.num_hidden_layers)
    vision = vision_tower_config(hf.vision_config, architecture, layers, post_norm=False)
    vision.update(
        image_token_id=hf.image_token_id,
        drop_class_token=hf.vision_feature_select_strategy == "default",
        projector="mlp",
        projector_act=require_activation(hf, "projector_hidden_act", architecture),
        extra=dict(text_architecture=text_class),
    )
    return dict(fields, original_architecture=architecture, vision_language=vision)


def convert_llava_config(hf: Any) -> dict:
    return _llava_config(hf, "LlavaForConditionalGeneration")


def _anyres_config(hf: Any, architecture: str) -> dict:
    fields = _llava_config(hf, architecture)
    fields["vision_language"].update(
        image_newline=True, image_grid_pinpoints=[list(g) for g in hf.image_grid_pinpoints]
    )
    return fields


def convert_llava_next_config(hf: Any) -> dict:
    return _anyres_config(hf, "LlavaNextForConditionalGeneration")


def convert_llava_onevision_config(hf: Any) -> dict:
    family = "LlavaOnevisionForConditionalGeneration"
    aspect = require_supported(
        hf, family, "vision_aspect_ratio", lambda v: str(v).startswith("anyres_max_"), describe="anyres_max_N"
    )
    fields = _anyres_config(hf, family)
    fields["vision_language"]["max_grid_tiles"] = int(aspect.removeprefix("anyres_max_"))
    return fields


# -- weights ----------------------------------------------------------------------------------


def convert_llava_weights(state: Mapping[str, torch.Tensor], cfg) -> dict[str, torch.Tensor]:
    """The language model's tensors, `vision.*` and `projector.*` (NeXT, OneVision: with `image_newline`)."""
    vcfg = cfg.vision_language
    sd = text_model_weights(state, cfg, vcfg.extra["text_architecture"])
    sd.update(vision_tower_weights(state, vcfg))
    p = first_prefix(state, _PROJECTOR_PREFIXES, "linear_1.weight")
    w_in, w_out = state[p + "linear_1.weight"], state[p + "linear_2.weight"]  # [d_model, d_features], [d, d]
    sd.update({
        "projector.W_in": w_in.T,  # [d_features, d_model]
        "projector.b_in": bias_or_zeros(state, p + "linear_1.bias", w_in.shape[0], w_in),
        "projector.W_out": w_out.T,  # [d_model, d_model]
        "projector.b_out": bias_or_zeros(state, p + "linear_2.bias", w_out.shape[0], w_out),
    })  # fmt: skip
    if vcfg.image_newline:
        sd["projector.image_newline"] = state[next(k for k in _NEWLINE_KEYS if k in state)]  # [d_model]
    return sd


register_architecture(("LlavaForConditionalGeneration",), convert_llava_config, convert_llava_weights)
register_architecture(("LlavaNextForConditionalGeneration",), convert_llava_next_config, convert_llava_weights)
register_architecture(
    ("LlavaOnevisionForConditionalGeneration",), convert_llava_onevision_config, convert_llava_weights
)
