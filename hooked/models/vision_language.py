"""`HookedVisionLanguageModel`: an image-text model (LLaVA, LLaVA-NeXT, LLaVA-OneVision, Gemma 3, Qwen2.5-VL), hooked.

It is a `HookedTransformer` (the language model: `embed`, `blocks`, `ln_final`, `unembed`, hooks as
always) with a vision tower and a projector beside it:

    pixel_values -> vision (a ViT: vision.embed, vision.blocks.{i}, ...) -> vision.hook_features
                 -> projector (projector.hook_pre/hook_post/hook_out) -> hook_image_features [image_tokens, d_model]
    tokens -> embed -> hook_embed; the image tokens' rows replaced by the image features -> hook_merged_embed
           -> blocks.0 ... -> logits

`HookedTransformer.from_pretrained(path)` returns one for these checkpoints, with the checkpoint's
processor (`model.processor`) when the directory has one. Every method that runs the model
(`__call__`, `run_with_cache`, `run_with_hooks`, `generate`) also takes `pixel_values=` (and
`image_sizes=` for the any-resolution models), or text with `images=` (PIL images), which runs the
processor so the image tokens are counted for you. `image_positions(tokens)` says which
positions hold which image's patches.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from jaxtyping import Bool, Float, Int

from hooked.components.anyres import n_tiles, pack_image_features
from hooked.components.projector import MLPProjector, PatchMerger, PoolingProjector
from hooked.components.qwen_vision import QwenVisionTower, mrope_positions, mrope_tables
from hooked.components.rotary import rotary_inv_freq
from hooked.components.vision import VisionTower
from hooked.core.config import HookedTransformerConfig
from hooked.core.errors import ConfigError, InputError
from hooked.core.hook_points import HookPoint
from hooked.core.utils import USE_DEFAULT_VALUE
from hooked.core.vision_config import VisionLanguageConfig
from hooked.generation import loop as _generation
from hooked.models.hooked_transformer import HookedTransformer
from hooked.models.image_positions import ImagePositions, image_positions


@dataclass
class ImageTextInputs:
    """What the checkpoint's processor makes of text and images: the model's inputs, image tokens counted.

    `model(inputs.tokens, **inputs.kwargs)` runs them; `inputs.image_kwargs` are the image arguments alone.
    """

    tokens: Int[torch.Tensor, "batch pos"]
    attention_mask: Int[torch.Tensor, "batch pos"]
    pixel_values: torch.Tensor
    image_sizes: Int[torch.Tensor, "images 2"] | None = None
    batch_num_images: Int[torch.Tensor, "batch"] | None = None
    image_grid_thw: Int[torch.Tensor, "images 3"] | None = None

    @property
    def image_kwargs(self) -> dict[str, torch.Tensor]:
        kwargs = dict(
            pixel_values=self.pixel_values, image_sizes=self.image_sizes, batch_num_images=self.batch_num_images,
            image_grid_thw=self.image_grid_thw,
        )  # fmt: skip
        return {k: v for k, v in kwargs.items() if v is not None}

    @property
    def kwargs(self) -> dict[str, torch.Tensor]:
        return dict(attention_mask=self.attention_mask, **self.image_kwargs)


@dataclass
class _ImageCall:
    """The image arguments of one call (a forward, or all of `generate`); features computed once, when first used."""

    pixel_values: torch.Tensor | None
    image_sizes: Any = None
    batch_num_images: Any = None
    token_type_ids: torch.Tensor | None = None
    image_grid_thw: torch.Tensor | None = None
    repeatable: bool = False  # a batch of whole copies of the prompts reads the images once per copy
    features: torch.Tensor | None = field(default=None, repr=False)
    rope_deltas: torch.Tensor | None = field(default=None, repr=False)  # Qwen2.5-VL: what decode steps add


def _image_parameter(name: str, annotation) -> inspect.Parameter:
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=annotation)


#: `generate`'s signature with the image arguments: `pixel_values=` (with `image_sizes=`,
#: `batch_num_images=` or `image_grid_thw=` where the family needs them), or `images=` with text.
_GENERATE = dataclasses.replace(
    _generation.GENERATE,
    first="self",
    extra=(
        _image_parameter("pixel_values", torch.Tensor | None),
        _image_parameter("image_sizes", Any),
        _image_parameter("batch_num_images", Any),
        _image_parameter("image_grid_thw", torch.Tensor | None),
        _image_parameter("images", Any),
    ),
)
_STREAM = dataclasses.replace(_generation.STREAM, first="self")


class HookedVisionLanguageModel(HookedTransformer):
    """A `HookedTransformer` whose input embeddings at image tokens are image features from a hooked ViT.

    Args:
        cfg: the language model's `HookedTransformerConfig`, with `vision_language` set.
        tokenizer: the language model's tokenizer (the processor's).
        move_to_device: move the new model to `cfg.device`.
        default_padding_side: padding used when a call does not choose one.
        processor: the checkpoint's HF processor (image processor and tokenizer), for `images=`.
    """

    def __init__(
        self, cfg, tokenizer=None, move_to_device: bool = True, default_padding_side: str = "right", processor=None
    ):
        cfg = HookedTransformerConfig.unwrap(cfg)
        vcfg = cfg.vision_language
        if vcfg is None:
            raise ConfigError("HookedVisionLanguageModel needs cfg.vision_language (the vision tower's config)")
        if cfg.positional_embedding_type != "rotary":
            raise ConfigError(
                "image features replace token embeddings before positions: the language model must be rotary"
            )
        vcfg.vision.dtype = cfg.dtype  # one dtype for both towers
        super().__init__(cfg, tokenizer, move_to_device=False, default_padding_side=default_padding_side)
        self.vision = QwenVisionTower(vcfg) if vcfg.dynamic_resolution else VisionTower(vcfg)
        projectors = {"mlp": MLPProjector, "pool": PoolingProjector, "merger": PatchMerger}
        self.projector = projectors[vcfg.projector](cfg, vcfg)
        self.hook_image_features = HookPoint()  # [image_tokens, d_model]
        self.hook_merged_embed = HookPoint()  # [batch, pos, d_model]
        self.processor = processor
        self._image_call: _ImageCall | None = None
        if cfg.init_weights:
            self.init_weights()
        if move_to_device and cfg.device is not None:
            self.to(cfg.device)
        self.setup()

    @property
    def vcfg(self) -> VisionLanguageConfig:
        """`cfg.vision_language`: the vision tower, the projector and the image token."""
        assert self.cfg.vision_language is not None  # __init__ refuses a config without it
        return self.cfg.vision_language

    # -- images to features ----------------------------------------------------------------
    def image_features(
        self,
        pixel_values: Float[torch.Tensor, "*images channels height width"] | Float[torch.Tensor, "patches flat"],
        image_sizes: Int[torch.Tensor, "images 2"] | Sequence[Sequence[int]] | None = None,
        batch_num_images: Sequence[int] | None = None,
        image_grid_thw: Int[torch.Tensor, "images 3"] | None = None,
    ) -> Float[torch.Tensor, "image_tokens d_model"]:
        """The features that replace the image tokens, in order: the vision tower, the projector, any tiling.

        Args:
            pixel_values: `[images, channels, H, W]`, or `[images, tiles, channels, H, W]` for the
                any-resolution models (each image's first tiles are used; the rest is padding), or
                Qwen2.5-VL's flattened patches `[patches, channels * frames * patch²]`.
            image_sizes: `[images, 2]` original `(height, width)` of each image (any-resolution models).
            batch_num_images: images per prompt (LLaVA-OneVision tiles only prompts with one image).
            image_grid_thw: Qwen2.5-VL: `[images, 3]` patches of each image along time, height and width.
        """
        if self.vcfg.dynamic_resolution:
            if image_grid_thw is None:
                raise InputError("Qwen2.5-VL needs image_grid_thw= ([images, 3], from its image processor)")
            patches = self.vision(pixel_values.to(self.input_device), image_grid_thw)  # [patches, d_vision]
            return self.hook_image_features(self.projector(patches))  # [image_tokens, d_model]
        tiles, counts = self._tiles(pixel_values, image_sizes, batch_num_images)
        projected = self.projector(self.vision(tiles))  # [tiles, tokens, d_model]
        if not self.vcfg.uses_anyres:
            return self.hook_image_features(projected.reshape(-1, self.cfg.d_model))
        sizes = _sizes(image_sizes)
        assert sizes is not None  # _tiles refuses an any-resolution call without image_sizes
        packed = [
            pack_image_features(
                chunk, size, self.vcfg.image_grid_pinpoints or [], self.vcfg.image_size,
                getattr(self.projector, "image_newline", None), self.vcfg.max_grid_tiles,
            )
            for chunk, size in zip(torch.split(projected, counts), sizes, strict=True)
        ]  # fmt: skip
        return self.hook_image_features(torch.cat(packed))  # [image_tokens, d_model]

    def _tiles(self, pixel_values, image_sizes, batch_num_images) -> tuple[torch.Tensor, list[int]]:
        """`([tiles, C, H, W], tiles per image)`: the images (or each image's tiles) the ViT reads."""
        pixels = pixel_values.to(self.input_device)
        if not self.vcfg.uses_anyres:
            if pixels.ndim != 4:
                raise InputError(f"pixel_values must be [images, channels, height, width], got {tuple(pixels.shape)}")
            return pixels, [1] * len(pixels)
        sizes = _sizes(image_sizes)
        if sizes is None:
            raise InputError("this any-resolution model needs image_sizes= ([images, 2], from its processor)")
        counts = self._tile_counts(sizes, batch_num_images)
        if pixels.ndim == 5:  # [images, max_tiles, C, H, W]: each image's first tiles
            pixels = torch.cat([p[:n] for p, n in zip(pixels, counts, strict=True)], dim=0)
        if pixels.ndim != 4 or len(pixels) != sum(counts):
            raise InputError(f"pixel_values {tuple(pixel_values.shape)} do not hold the {sum(counts)} tiles of {sizes}")
        return pixels, counts

    def _tile_counts(self, sizes: list[list[int]], batch_num_images) -> list[int]:
        tiled = self._tiled(len(sizes), batch_num_images)
        pinpoints = self.vcfg.image_grid_pinpoints or []
        return [n_tiles(s, pinpoints, self.vcfg.image_size) if t else 1 for s, t in zip(sizes, tiled, strict=True)]

    def _tiled(self, n_images: int, batch_num_images) -> list[bool]:
        """Which images are tiled: all, except (OneVision) those of prompts holding several images."""
        if batch_num_images is None or self.vcfg.max_grid_tiles is None:
            return [True] * n_images
        return [int(n) == 1 for n in batch_num_images for _ in range(int(n))]

    # -- the forward pass ------------------------------------------------------------------
    def forward(
        self,
        input,
        *args,
        pixel_values: torch.Tensor | None = None,
        image_sizes=None,
        batch_num_images=None,
        token_type_ids: Int[torch.Tensor, "batch pos"] | None = None,
        image_grid_thw: Int[torch.Tensor, "images 3"] | None = None,
        images=None,
        **kwargs,
    ):
        """`HookedTransformer.forward`, with images: `pixel_values=` (and `image_sizes=`, Qwen2.5-VL's
        `image_grid_thw=`), or text with `images=`.

        The image features replace the embeddings of the image tokens (`hook_merged_embed`). With a KV
        cache that already holds positions (a decode step) the images are not read again, as in HF.
        `token_type_ids` (Gemma 3, 1 at image tokens) makes image tokens attend bidirectionally without
        pixel values; with pixel values the image tokens are found in the tokens.
        """
        if images is not None:
            inputs = self.prepare_inputs(input, images)
            input, pixel_values = inputs.tokens, inputs.pixel_values
            image_sizes, batch_num_images = inputs.image_sizes, inputs.batch_num_images
            image_grid_thw = inputs.image_grid_thw
            kwargs.setdefault("attention_mask", inputs.attention_mask)
        call = None
        if pixel_values is not None or token_type_ids is not None:
            call = _ImageCall(pixel_values, image_sizes, batch_num_images, token_type_ids, image_grid_thw)
        with self._with_images(call):
            return super().forward(input, *args, **kwargs)

    @contextlib.contextmanager
    def using_images(
        self,
        pixel_values: torch.Tensor,
        image_sizes: Int[torch.Tensor, "images 2"] | None = None,
        batch_num_images: Int[torch.Tensor, "batch"] | None = None,
        image_grid_thw: Int[torch.Tensor, "images 3"] | None = None,
    ) -> Iterator[HookedVisionLanguageModel]:
        """Every forward inside reads these images: for code that calls `model(tokens)` itself.

        Activation patching, attribution and circuit methods run the model on tokens alone; inside
        this context those runs see the images. A batch made of whole copies of the prompts (batched
        patching repeats them) reads the images once per copy. The vision tower runs once.

            with model.using_images(pixel_values_b):
                results = patching.get_act_patch_resid_pre(model, tokens, cache_a, metric)
        """
        call = _ImageCall(pixel_values, image_sizes, batch_num_images, image_grid_thw=image_grid_thw, repeatable=True)
        with self._with_images(call):
            yield self

    @contextlib.contextmanager
    def _with_images(self, call: _ImageCall | None) -> Iterator[None]:
        """Make `call` the image arguments of the forward passes inside (none given: keep the outer ones)."""
        if call is None:
            yield
            return
        outer, self._image_call = self._image_call, call
        try:
            yield
        finally:
            self._image_call = outer

    def input_to_embed(
        self,
        input,
        prepend_bos=USE_DEFAULT_VALUE,
        padding_side=USE_DEFAULT_VALUE,
        attention_mask=None,
        past_kv_cache=None,
        *,
        step: int | None = None,
    ):
        """`HookedTransformer.input_to_embed`, then the image features written over the image tokens."""
        residual, tokens, shortformer, attention_mask = super().input_to_embed(
            input, prepend_bos, padding_side, attention_mask, past_kv_cache, step=step
        )
        call, state = self._image_call, self.forward_state
        assert state is not None  # super().input_to_embed has just set it
        prefill = state.n_keys == state.n_queries  # nothing cached before: not a decode step
        if call is not None and prefill:
            residual = self._merge_images(residual, tokens, call)
        if call is not None and self.vcfg.mrope_section is not None:
            state.rotary_tables = self._mrope_tables(tokens, state, call, prefill)
        return self.hook_merged_embed(residual), tokens, shortformer, attention_mask

    def _mrope_tables(self, tokens, state, call: _ImageCall, prefill: bool):
        """Qwen2.5-VL's M-RoPE tables: 3-D positions at the prefill, then 1-D positions shifted by the deltas."""
        if prefill:
            if tokens is None or call.image_grid_thw is None:
                raise InputError("Qwen2.5-VL's 3-D positions need token input and image_grid_thw=")
            positions, call.rope_deltas = mrope_positions(
                tokens,
                state.attention_mask,
                self.vcfg.image_token_id,
                call.image_grid_thw,
                self.vcfg.spatial_merge_size,
            )
        elif call.rope_deltas is not None:
            positions = (state.positions + call.rope_deltas[:, None]).expand(3, -1, -1)  # [3, batch, pos]
        else:
            return None
        section, cfg = self.vcfg.mrope_section, self.cfg
        assert section is not None and cfg.rotary_dim is not None  # the caller checks; rotary models have it
        inv_freq = rotary_inv_freq(cfg.rotary_dim, cfg.rotary_base, cfg.rotary_scaling)  # the layers' frequencies
        return mrope_tables(positions, inv_freq.to(positions.device), section, cfg.dtype)

    def _merge_images(self, residual: torch.Tensor, tokens: torch.Tensor | None, call: _ImageCall) -> torch.Tensor:
        """Scatter the image features into the image tokens' rows; Gemma 3: mark the image blocks."""
        if tokens is None:
            raise InputError("images need token input: the image tokens mark where their features go")
        is_image = tokens == self.vcfg.image_token_id  # [batch, pos]
        if self.vcfg.bidirectional_image_attention:
            assert self.forward_state is not None  # input_to_embed has just set it
            marks = is_image if call.pixel_values is not None else call.token_type_ids == 1
            self.forward_state.key_blocks = image_blocks(marks.to(tokens.device).bool())
        if call.pixel_values is None:
            return residual
        if call.features is None:
            call.features = self.image_features(
                call.pixel_values, call.image_sizes, call.batch_num_images, call.image_grid_thw
            )
        features = call.features.to(residual.device, residual.dtype)  # [image_tokens, d_model]
        n_tokens, n_features = int(is_image.sum()), features.shape[0]
        copies = n_tokens // max(n_features, 1)
        if call.repeatable and copies > 1 and n_tokens == copies * n_features and len(tokens) % copies == 0:
            features = features.repeat(copies, 1)  # [copies * image_tokens, d_model]: the batch repeats its prompts
        elif n_tokens != n_features:
            raise InputError(
                f"the tokens hold {n_tokens} image tokens but the images give {n_features} features: tokenize "
                "with the model's processor (model.prepare_inputs(text, images=...)), which counts them"
            )
        return residual.masked_scatter(is_image[..., None], features)  # [batch, pos, d_model]

    # -- generation ------------------------------------------------------------------------
    @_GENERATE.surface
    def generate(self, *args, **kwargs):
        """`HookedTransformer.generate` with an image: `pixel_values=` (and `image_sizes=`) or text with `images=`.

        The images are read once, at the prefill (every step, without the KV cache). Text with
        `images=` returns text by default, as text input does. The other arguments are `generate`'s.
        """
        bound = _GENERATE.bind(self, *args, **kwargs)
        options, input, mask, image = bound.resolve(), bound.input, bound.attention_mask, dict(bound.extra)
        images = image.pop("images")
        if images is not None:
            inputs = self.prepare_inputs(input, images, padding_side="left")
            if options.return_type == "input":
                options = dataclasses.replace(options, return_type="str")
            input = inputs.tokens
            mask = inputs.attention_mask if mask is None else mask
            image.update(
                pixel_values=inputs.pixel_values, image_sizes=inputs.image_sizes,
                batch_num_images=inputs.batch_num_images, image_grid_thw=inputs.image_grid_thw,
            )  # fmt: skip
        if image["pixel_values"] is not None and options.static:
            raise InputError("generate with images runs the dynamic KV cache: leave cache_implementation unset")
        call = None if image["pixel_values"] is None else _ImageCall(**image)
        with self._with_images(call):
            return _generation.generate(self, input, attention_mask=mask, options=options)

    @_STREAM.surface
    def generate_stream(self, *args, **kwargs):
        if any(kwargs.get(k) is not None for k in ("pixel_values", "images")):
            raise InputError("generate_stream does not take images yet: use generate(..., pixel_values=...)")
        return _generation.generate_stream(self, *args, **kwargs)

    # -- the processor -----------------------------------------------------------------------
    def prepare_inputs(self, text: str | list[str], images, padding_side: str | None = None) -> ImageTextInputs:
        """Run the checkpoint's processor: text with image placeholders and PIL images -> tokens, pixels, sizes.

        Each placeholder (the processor's image token, e.g. `"<image>"`) becomes as many image tokens as
        the image has features. `images` is one image, a list (one per placeholder of a single text), or
        a list of lists (one list per text).
        """
        if self.processor is None:
            raise InputError(
                "this model has no processor: load it from a checkpoint directory that has one, or set "
                "model.processor = transformers.AutoProcessor.from_pretrained(...)"
            )
        if not isinstance(text, (str, list)):
            raise InputError("images= goes with text (with the image placeholder); with tokens pass pixel_values=")
        side = padding_side or self.default_padding_side
        out = self.processor(text=text, images=images, return_tensors="pt", padding=True, padding_side=side)
        device = self.input_device
        return ImageTextInputs(
            tokens=out["input_ids"].to(device),
            attention_mask=out["attention_mask"].to(device),
            pixel_values=out["pixel_values"],
            image_sizes=out.get("image_sizes"),
            batch_num_images=out.get("batch_num_images"),
            image_grid_thw=out.get("image_grid_thw"),
        )

    def to_tokens(self, input, *args, images=None, **kwargs):
        """`HookedTransformer.to_tokens`; with `images=` the processor's tokens (image tokens expanded)."""
        if images is None:
            return super().to_tokens(input, *args, **kwargs)
        inputs = self.prepare_inputs(input, images, kwargs.get("padding_side"))
        return (inputs.tokens, inputs.attention_mask) if kwargs.get("return_attention_mask") else inputs.tokens

    def image_positions(
        self,
        tokens: Int[torch.Tensor, "batch pos"],
        image_sizes: Int[torch.Tensor, "images 2"] | Sequence[Sequence[int]] | None = None,
        batch_num_images: Sequence[int] | None = None,
        image_grid_thw: Int[torch.Tensor, "images 3"] | None = None,
    ) -> ImagePositions:
        """Which positions of `tokens` hold which image's tile and patch (see `ImagePositions`)."""
        sizes = _sizes(image_sizes)
        n_images = None if sizes is None else len(sizes)
        tiled = None if n_images is None else self._tiled(n_images, batch_num_images)
        return image_positions(self.vcfg, tokens, sizes, tiled, image_grid_thw)

    def _keep_cfg_in_step(self, device: torch.device | str | None, dtype: torch.dtype | None) -> None:
        """`to` keeps the vision tower's config in step too (one device and dtype for both towers)."""
        super()._keep_cfg_in_step(device, dtype)
        if self.cfg.vision_language is not None:
            self.vcfg.vision.dtype, self.vcfg.vision.device = self.cfg.dtype, self.cfg.device


# an image-text config loads as this class (`HookedTransformer.from_pretrained` asks `model_class_for`)
HookedTransformer.register_variant(lambda cfg: cfg.vision_language is not None, HookedVisionLanguageModel)


def image_blocks(is_image: Bool[torch.Tensor, "batch pos"]) -> Int[torch.Tensor, "batch pos"]:
    """Gemma 3's bidirectional blocks: each run of consecutive image tokens is one block (its id), text is -1."""
    previous = torch.nn.functional.pad(is_image, (1, 0))[:, :-1]  # [batch, pos]: the token before is an image's
    starts = is_image & ~previous
    ids = torch.cumsum(starts.long(), dim=1) - 1  # [batch, pos]
    return torch.where(is_image, ids, -1)


def _sizes(image_sizes) -> list[list[int]] | None:
    if image_sizes is None:
        return None
    return [[int(v) for v in size] for size in (image_sizes.tolist() if torch.is_tensor(image_sizes) else image_sizes)]
