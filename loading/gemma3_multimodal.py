"""Gemma 3 with images (`Gemma3ForConditionalGeneration`): SigLIP, a pooling projector and the Gemma 3 text model.

    features = post_layernorm(SigLIP(pixels))                       # [images, patches, d_vision]
    tokens   = avg_pool(features as a square grid) -> RMSNorm (gain 1 + w) -> @ mm_input_projection_weight
    x = embed_tokens(tokens) * sqrt(d_model);  x[image tokens] = tokens (unscaled)
    the text model as Gemma 3's, except that the tokens of one image attend to each other in both
    directions (HF's `token_type_ids` mask: causal OR same image, then the sliding window)

The text model's tensors convert as `hooked.loading.gemma`'s; the projector becomes `projector.W`
and `projector.norm.w` (holding `1 + w`). A config without a vision tower (an official
name's text-only config) gives the text model alone, as before.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from hooked.loading.gemma import _gain, convert_gemma3_config, convert_gemma_weights
from hooked.loading.registry import register_architecture
from hooked.loading.vision_towers import first_prefix, vision_tower_config, vision_tower_weights

_PROJECTOR_PREFIXES = ("model.multi_modal_projector.", "multi_modal_projector.")


def convert_gemma3_image_text_config(hf: Any) -> dict:
    """The Gemma 3 text model's fields and, when the config has a vision tower, `vision_language`."""
    fields = convert_gemma3_config(hf)
    vision_hf = getattr(hf, "vision_config", None)
    if vision_hf is None:
        return fields
    vision = vision_tower_config(vision_hf, "Gemma3ForConditionalGeneration", (vision_hf.num_hidden_layers,), True)
    vision.update(
        image_token_id=hf.image_token_id,
        projector="pool",
        projector_eps=vision_hf.layer_norm_eps,
        mm_tokens_per_image=hf.mm_tokens_per_image,
        bidirectional_image_attention=True,
    )
    return dict(fields, original_architecture="Gemma3ForConditionalGeneration", vision_language=vision)


def convert_gemma3_image_text_weights(state: Mapping[str, torch.Tensor], cfg) -> dict[str, torch.Tensor]:
    sd = convert_gemma_weights(state, cfg)
    if cfg.vision_language is None:
        return sd
    sd.update(vision_tower_weights(state, cfg.vision_language))
    p = first_prefix(state, _PROJECTOR_PREFIXES, "mm_input_projection_weight")
    sd["projector.W"] = state[p + "mm_input_projection_weight"]  # [d_vision, d_model]: HF right-multiplies too
    sd["projector.norm.w"] = _gain(state[p + "mm_soft_emb_norm.weight"])  # [d_vision], the gain 1 + w
    return sd


register_architecture(
    ("Gemma3ForConditionalGeneration",), convert_gemma3_image_text_config, convert_gemma3_image_text_weights
)
