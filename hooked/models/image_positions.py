"""Which text positions hold image features, and which image, tile and patch each came from.

An image-text model replaces the embedding at every image-token position with one image
feature. `ImagePositions` is that map, one entry per image token, so patching and attribution
can address "image 0, patch (3, 5)" instead of counting tokens by hand. Tiles: 0 is the whole
image resized to one tile (LLaVA, Gemma 3 and the *base* image of LLaVA-NeXT/OneVision);
1, 2, ... are the any-resolution grid's tiles in row-major order. `row`/`col` locate the patch
(Gemma 3: the pooled token) in its tile's grid of `tokens_per_side`².
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from jaxtyping import Int

from hooked.components.anyres import NEWLINE, grid_shape, n_tiles, packed_sources
from hooked.core.errors import InputError
from hooked.core.vision_config import VisionLanguageConfig

#: `ImagePositions` source mark of CLIP's class token (kept by `vision_feature_select_strategy="full"`)
CLASS = -3


@dataclass(frozen=True)
class ImagePositions:
    """One entry per image token, in sequence order; every field is a `[n_image_tokens]` LongTensor.

    Attributes:
        batch, pos: where the token sits in the model's input `[batch, pos]`.
        image: which image of the call (in the order the images were given).
        tile: 0 for the whole image, k >= 1 for the k-th tile of the any-resolution grid; -1 for a
            newline token, a token of a downsampled grid (a blend of patches) or a kept class token.
        row, col: the patch's place in its tile, in `[0, tokens_per_side)` (Qwen2.5-VL: in the image's own
            grid of merged patches); -1 where `tile` is -1.
        newline: 1 for LLaVA-NeXT/OneVision's `image_newline` tokens.
        tokens_per_side: the side of one tile's grid of image tokens (0: each image has its own grid).
        grids: `(rows, cols)` of tiles of each image's any-resolution grid, `(0, 0)` without one.
    """

    batch: Int[torch.Tensor, "n"]
    pos: Int[torch.Tensor, "n"]
    image: Int[torch.Tensor, "n"]
    tile: Int[torch.Tensor, "n"]
    row: Int[torch.Tensor, "n"]
    col: Int[torch.Tensor, "n"]
    newline: Int[torch.Tensor, "n"]
    tokens_per_side: int
    grids: tuple[tuple[int, int], ...]

    def __len__(self) -> int:
        return int(self.pos.numel())

    @property
    def n_images(self) -> int:
        return len(self.grids)

    def select(self, image: int | None = None, tile: int | None = None) -> Int[torch.Tensor, "n"]:
        """Indices (into these fields) of the tokens of `image` and `tile` (None: any)."""
        keep = torch.ones_like(self.pos, dtype=torch.bool)
        if image is not None:
            keep &= self.image == image
        if tile is not None:
            keep &= self.tile == tile
        return keep.nonzero().flatten()

    def grid(self, image: int = 0, tile: int = 0) -> Int[torch.Tensor, "rows cols"]:
        """Sequence positions of one tile's tokens laid out as the image: `[row, col]` -> pos, -1 where none.

        A high-resolution tile whose padding was cut off has -1 in the cut rows or columns.
        """
        if not 0 <= image < self.n_images:
            raise InputError(f"image={image} is outside the call's {self.n_images} images")
        idx = self.select(image, tile)
        rows = cols = self.tokens_per_side
        if not rows and len(idx):  # each image its own grid (Qwen2.5-VL): as large as its tokens reach
            rows, cols = int(self.row[idx].max()) + 1, int(self.col[idx].max()) + 1
        out = torch.full((rows, cols), -1, dtype=torch.long)
        if not len(idx) and tile != 0:
            rows, cols = self.grids[image]
            raise InputError(f"image {image} has no tile {tile}: its grid has {rows * cols} tiles (1..{rows * cols})")
        out[self.row[idx], self.col[idx]] = self.pos[idx]
        return out

    def at(self, image: int = 0, row: int = 0, col: int = 0, tile: int = 0) -> tuple[int, int]:
        """`(batch, pos)` of the token of `image`'s patch `(row, col)` in `tile`."""
        keep = (self.image == image) & (self.tile == tile) & (self.row == row) & (self.col == col)
        hit = keep.nonzero().flatten()
        if not len(hit):
            raise InputError(f"no image token for image {image}, tile {tile}, patch ({row}, {col})")
        return int(self.batch[hit[0]]), int(self.pos[hit[0]])


def image_token_layouts(
    vcfg: VisionLanguageConfig,
    n_images: int,
    image_sizes: Sequence[Sequence[int]] | None,
    tiled: Sequence[bool] | None = None,
) -> list[torch.Tensor]:
    """For each image, the source of each of its tokens: `tile * patches + patch`, or NEWLINE/INTERPOLATED."""
    side = vcfg.tokens_per_side
    if not vcfg.uses_anyres:  # CLIP's class token, when the features keep it, comes first
        layout = torch.cat([torch.full((vcfg.tokens_per_image - side * side,), CLASS), torch.arange(side * side)])
        return [layout for _ in range(n_images)]
    if image_sizes is None or len(image_sizes) != n_images:
        raise InputError(f"any-resolution models need image_sizes, one (height, width) per image ({n_images} images)")
    assert vcfg.image_grid_pinpoints is not None  # uses_anyres
    layouts = []
    for i, size in enumerate(image_sizes):
        count = n_tiles(size, vcfg.image_grid_pinpoints, vcfg.image_size) if tiled is None or tiled[i] else 1
        layouts.append(
            packed_sources(
                count, side * side, size, vcfg.image_grid_pinpoints, vcfg.image_size, vcfg.image_newline,
                vcfg.max_grid_tiles,
            )
        )  # fmt: skip
    return layouts


def image_positions(
    vcfg: VisionLanguageConfig,
    tokens: Int[torch.Tensor, "batch pos"],
    image_sizes: Sequence[Sequence[int]] | None = None,
    tiled: Sequence[bool] | None = None,
    grid_thw: Int[torch.Tensor, "images 3"] | None = None,
) -> ImagePositions:
    """The `ImagePositions` of `tokens`: the image tokens, in order, split into images by their layouts."""
    batch, pos = (tokens.cpu() == vcfg.image_token_id).nonzero(as_tuple=True)
    if vcfg.dynamic_resolution:
        return _dynamic_positions(vcfg, batch, pos, grid_thw)
    n_images = len(image_sizes) if image_sizes is not None else len(pos) // vcfg.tokens_per_image
    layouts = image_token_layouts(vcfg, n_images, image_sizes, tiled)
    sources = torch.cat(layouts) if layouts else torch.zeros(0, dtype=torch.long)
    if len(sources) != len(pos):
        raise InputError(
            f"the tokens hold {len(pos)} image tokens but {n_images} image(s) need {len(sources)}: tokenize the "
            "prompt with the model's processor (model.prepare_inputs(text, images=...)) so the counts agree"
        )
    image = torch.cat([torch.full((len(x),), i) for i, x in enumerate(layouts)]) if layouts else sources
    tile, row, col = _tile_row_col(sources, vcfg.tokens_per_side)
    grids = tuple(_grid_of(vcfg, image_sizes, i, tiled) for i in range(n_images))
    newline = (sources == NEWLINE).long()
    return ImagePositions(batch, pos, image, tile, row, col, newline, vcfg.tokens_per_side, grids)


def _tile_row_col(sources: torch.Tensor, side: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    special = sources < 0  # NEWLINE, INTERPOLATED, CLASS
    safe = sources.clamp(min=0)
    patch = safe % (side * side)
    tile, row, col = safe // (side * side), patch // side, patch % side
    return tile.masked_fill(special, -1), row.masked_fill(special, -1), col.masked_fill(special, -1)


def _grid_of(vcfg: VisionLanguageConfig, image_sizes, i: int, tiled) -> tuple[int, int]:
    if not vcfg.uses_anyres or (tiled is not None and not tiled[i]):
        return (0, 0)
    assert vcfg.image_grid_pinpoints is not None and image_sizes is not None  # checked by image_token_layouts
    return grid_shape(image_sizes[i], vcfg.image_grid_pinpoints, vcfg.image_size)


def _dynamic_positions(vcfg: VisionLanguageConfig, batch, pos, grid_thw) -> ImagePositions:
    """Qwen2.5-VL: image i's tokens are its (frames x rows x cols) grid of merged patches in reading order."""
    if grid_thw is None:
        raise InputError("Qwen2.5-VL's image positions need image_grid_thw= ([images, 3], from its image processor)")
    merge, image, row, col = vcfg.spatial_merge_size, [], [], []
    for i, (t, h, w) in enumerate(grid_thw.tolist()):
        rows, cols = h // merge, w // merge
        k = torch.arange(t * rows * cols)
        image.append(torch.full_like(k, i))
        row.append((k // cols) % rows)
        col.append(k % cols)
    image_t, row_t, col_t = (torch.cat(x) if x else torch.zeros(0, dtype=torch.long) for x in (image, row, col))
    if len(image_t) != len(pos):
        raise InputError(
            f"the tokens hold {len(pos)} image tokens but image_grid_thw gives {len(image_t)}: write one image "
            "token per merged patch (t * h * w / merge²) for each image"
        )
    zeros = torch.zeros_like(image_t)
    return ImagePositions(batch, pos, image_t, zeros, row_t, col_t, zeros, 0, tuple((0, 0) for _ in grid_thw))
