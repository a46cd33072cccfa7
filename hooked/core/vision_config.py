"""`VisionLanguageConfig`: the image side of an image-text model (LLaVA and its successors, Gemma 3, Qwen2.5-VL).

An image-text model is a language model whose input embeddings at some positions (the image
tokens) are replaced by image features. The features come from a vision transformer (ViT):
the image is cut into `patch_size` x `patch_size` patches, each patch becomes one position,
and pre-norm blocks with bidirectional attention (no causal mask) mix them. A projector maps
the ViT's hidden states at `feature_layers` into the language model's `d_model`. This config
holds those choices; `HookedTransformerConfig.vision_language` carries it beside the language
model's own fields.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from hooked.core.config import ACT_FNS, HookedTransformerConfig
from hooked.core.errors import ConfigError

PROJECTORS = ("mlp", "pool", "merger")


@dataclass
class VisionLanguageConfig:
    """The vision tower, the projector and how image features are laid out among the text tokens."""

    vision: HookedTransformerConfig
    """The ViT's blocks (`vision.blocks.{i}`): LayerNorm, bidirectional attention, a dense MLP. Only the blocks up
    to the deepest of `feature_layers` are built: later ones cannot change what the language model reads."""
    image_size: int
    """Side, in pixels, of the square image (or tile) the ViT reads."""
    patch_size: int
    """Side, in pixels, of one patch; the ViT sees `(image_size // patch_size) ** 2` patches."""
    image_token_id: int
    """The placeholder token whose positions receive image features, one feature per placeholder."""
    num_channels: int = 3
    """Colour channels of `pixel_values`."""
    patch_bias: bool = False
    """The patch embedding (a strided convolution) has a bias (SigLIP) or not (CLIP)."""
    class_token: bool = False
    """CLIP: a learned class embedding is put before the patches (position 0 of the ViT)."""
    pre_norm: bool = False
    """CLIP: a LayerNorm (`vision.ln_pre`) on the embeddings before block 0."""
    post_norm: bool = False
    """The features pass the tower's final LayerNorm (`vision.ln_post`): Gemma 3 reads SigLIP's normalized output."""
    feature_layers: tuple[int, ...] = (-1,)
    """The ViT hidden states the projector reads, concatenated along d_model: index 0 is the embedding entering
    block 0 (after `ln_pre`), index i the output of block i - 1. Stored non-negative (HF's -2 becomes L - 1)."""
    drop_class_token: bool = False
    """LLaVA's `vision_feature_select_strategy="default"`: the first ViT position is dropped from the features."""
    projector: str = "mlp"
    """`mlp` (LLaVA: linear, activation, linear) or `pool` (Gemma 3: average pooling, RMSNorm, one matrix)."""
    projector_act: str | None = "gelu"
    """Activation between the two linear layers of the `mlp` projector."""
    projector_eps: float = 1e-6
    """Epsilon of the `pool` projector's RMSNorm."""
    mm_tokens_per_image: int | None = None
    """Gemma 3: image tokens per image after pooling (a square number)."""
    image_newline: bool = False
    """LLaVA-NeXT/OneVision: a learned embedding ends every row of the high-resolution grid (or the base image)."""
    image_grid_pinpoints: list[list[int]] | None = None
    """Any-resolution tiling (LLaVA-NeXT/OneVision): the `[height, width]` grids an image may be resized to; the
    best fit is cut into `image_size` tiles, each read by the ViT beside the whole image resized to one tile."""
    max_grid_tiles: int | None = None
    """LLaVA-OneVision's `anyres_max_N`: a high-resolution grid larger than about N tiles is downsampled."""
    bidirectional_image_attention: bool = False
    """Gemma 3: in the language model, the tokens of one image attend to each other in both directions."""
    temporal_patch_size: int = 1
    """Qwen2.5-VL: frames per patch (the processor repeats a still image to fill them); 1: flat patches."""
    spatial_merge_size: int = 1
    """Qwen2.5-VL: side of the square of neighbouring patches the `merger` projector makes one image token."""
    window_size: int | None = None
    """Qwen2.5-VL: side, in pixels, of the windows the ViT attends within (outside `full_attention_blocks`)."""
    full_attention_blocks: tuple[int, ...] = ()
    """Qwen2.5-VL: the ViT blocks that attend over each whole image instead of a window."""
    vision_rotary_base: float | None = None
    """Qwen2.5-VL: base of the ViT's 2-D rotary embedding of patch rows and columns; None: learned positions."""
    mrope_section: tuple[int, ...] | None = None
    """Qwen2.5-VL: how the language model's rotary frequencies split among time, height and width positions
    (M-RoPE: image tokens get 3-D positions); None: 1-D positions."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Unused settings kept for provenance (the HF class names of the towers)."""

    def __post_init__(self) -> None:
        if self.projector not in PROJECTORS:
            raise ConfigError(f"projector must be one of {PROJECTORS}, got {self.projector!r}")
        if self.image_size % self.patch_size:
            raise ConfigError(f"image_size ({self.image_size}) must be a multiple of patch_size ({self.patch_size})")
        if any(not 0 <= i <= self.vision.n_layers for i in self.feature_layers):
            raise ConfigError(
                f"feature_layers {self.feature_layers} must lie in [0, {self.vision.n_layers}]: the ViT's hidden states"
            )
        if self.projector == "mlp" and self.projector_act not in ACT_FNS:
            raise ConfigError(f"projector_act must be one of {ACT_FNS}, got {self.projector_act!r}")
        if self.projector == "pool":
            self._check_pooling()

    def _check_pooling(self) -> None:
        side = round((self.mm_tokens_per_image or 0) ** 0.5)
        if side * side != self.mm_tokens_per_image or self.patches_per_side % side:
            raise ConfigError(
                f"mm_tokens_per_image ({self.mm_tokens_per_image}) must be a square whose side divides the "
                f"{self.patches_per_side} patches per side"
            )

    # -- derived facts ------------------------------------------------------------------------
    @property
    def patches_per_side(self) -> int:
        """Patches along each side of the image (or tile)."""
        return self.image_size // self.patch_size

    @property
    def n_patches(self) -> int:
        """Patches per image (or tile)."""
        return self.patches_per_side**2

    @property
    def n_vision_positions(self) -> int:
        """Positions the ViT reads: the patches, and the class token first if there is one."""
        return self.n_patches + int(self.class_token)

    @property
    def d_features(self) -> int:
        """Width of the projector's input: the ViT's d_model once per feature layer."""
        return self.vision.d_model * len(self.feature_layers)

    @property
    def dynamic_resolution(self) -> bool:
        """Each image keeps its own grid of patches (Qwen2.5-VL, `image_grid_thw`) instead of a fixed size."""
        return self.vision_rotary_base is not None

    @property
    def tokens_per_side(self) -> int:
        """Side of the square grid of image tokens one image (or tile) becomes (after pooling, for Gemma 3);
        0 where each image has its own grid (`dynamic_resolution`)."""
        if self.dynamic_resolution:
            return 0
        if self.projector == "pool":
            return round((self.mm_tokens_per_image or 0) ** 0.5)
        return self.patches_per_side

    @property
    def tokens_per_image(self) -> int:
        """Image tokens of one image without tiling: its grid, and CLIP's class token if the features keep it."""
        kept_class = self.class_token and not self.drop_class_token and self.projector == "mlp"
        return self.tokens_per_side**2 + int(kept_class)

    @property
    def uses_anyres(self) -> bool:
        """Images are tiled at any resolution (LLaVA-NeXT/OneVision) rather than resized to one tile."""
        return bool(self.image_grid_pinpoints)

    # -- (de)serialisation ---------------------------------------------------------------------
    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> VisionLanguageConfig:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ConfigError(f"Unknown VisionLanguageConfig field(s) {unknown}; the dataclass fields list the names")
        d = dict(d)
        if isinstance(d.get("vision"), dict):
            d["vision"] = HookedTransformerConfig.from_dict(d["vision"])
        for key in ("feature_layers", "full_attention_blocks", "mrope_section"):
            if d.get(key) is not None:
                d[key] = tuple(int(i) for i in d[key])
        return cls(**d)

    def to_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        d["vision"] = self.vision.to_dict()
        return d
