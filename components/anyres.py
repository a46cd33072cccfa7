"""Any-resolution tiling (LLaVA-NeXT, LLaVA-OneVision): where each image token's feature comes from.

The processor resizes an image to the best-fitting grid of `image_grid_pinpoints` (`rows x cols`
tiles of `image_size` pixels, padded to the grid's aspect ratio) and also to one tile (the
*base* image). The ViT reads every tile; the language model then reads the base image's
patches, followed by the high-resolution grid stitched back into one feature map, with the
padding rows or columns cut off ("unpadded") and a learned `image_newline` after each row.
LLaVA-OneVision also shrinks a grid larger than about `max_grid_tiles` tiles (bilinearly).

`pack_image_features` does this op for op as HuggingFace; `packed_sources` runs the very same
function on the feature rows' indices, so the positions helper
(`HookedVisionLanguageModel.image_positions`) names the tile and patch behind each token.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from jaxtyping import Float

#: `packed_sources` marks: a newline token, and a token of a bilinearly shrunk grid (no single source patch)
NEWLINE, INTERPOLATED = -1, -2


def select_best_resolution(original_size: Sequence[int], possible_resolutions: Sequence[Sequence[int]]) -> tuple:
    """The `(height, width)` grid that keeps most of the image's resolution and wastes least (HF's rule)."""
    original_height, original_width = original_size
    best_fit, max_effective, min_wasted = None, 0, float("inf")
    for height, width in possible_resolutions:
        scale = min(width / original_width, height / original_height)
        downscaled_width, downscaled_height = int(original_width * scale), int(original_height * scale)
        effective = min(downscaled_width * downscaled_height, original_width * original_height)
        wasted = (width * height) - effective
        if effective > max_effective or (effective == max_effective and wasted < min_wasted):
            max_effective, min_wasted, best_fit = effective, wasted, (height, width)
    assert best_fit is not None  # a non-empty list of grids always has a best one
    return best_fit


def grid_shape(image_size: Sequence[int], pinpoints: Sequence[Sequence[int]], tile_size: int) -> tuple[int, int]:
    """`(rows, cols)` of tiles the image of `(height, width)` pixels is cut into."""
    height, width = select_best_resolution([int(s) for s in image_size], pinpoints)
    return height // tile_size, width // tile_size


def n_tiles(image_size: Sequence[int], pinpoints: Sequence[Sequence[int]], tile_size: int) -> int:
    """Images the ViT reads for one image: its grid's tiles and the base image."""
    rows, cols = grid_shape(image_size, pinpoints, tile_size)
    return rows * cols + 1


def unpad(
    features: Float[torch.Tensor, "d rows cols"], original_size: Sequence[int]
) -> Float[torch.Tensor, "d unpadded_rows unpadded_cols"]:
    """Cut off the rows (or columns) the processor padded to fit the grid's aspect ratio (HF's `unpad_image`)."""
    original_height, original_width = (int(s) for s in original_size)
    current_height, current_width = features.shape[1:]
    if original_width / original_height > current_width / current_height:
        new_height = int(round(original_height * (current_width / original_width), 7))
        padding = (current_height - new_height) // 2
        return features[:, padding : current_height - padding, :]
    new_width = int(round(original_width * (current_height / original_height), 7))
    padding = (current_width - new_width) // 2
    return features[:, :, padding : current_width - padding]


def shrink(features: Float[torch.Tensor, "d rows cols"], max_tiles: int, side: int) -> torch.Tensor:
    """LLaVA-OneVision's `anyres_max_N`: a grid over ~1.1 x N tiles of `side`² patches is resized bilinearly."""
    _, rows, cols = features.shape
    ratio = math.sqrt(rows * cols / (max_tiles * side**2))
    if ratio <= 1.1:
        return features
    size = [int(rows // ratio), int(cols // ratio)]
    return F.interpolate(features[None], size, mode="bilinear")[0]  # [d, rows', cols']


def pack_image_features(
    tiles: Float[torch.Tensor, "tiles patches d_model"],
    image_size: Sequence[int],
    pinpoints: Sequence[Sequence[int]],
    tile_size: int,
    newline: Float[torch.Tensor, "d_model"] | None,
    max_tiles: int | None = None,
) -> Float[torch.Tensor, "tokens d_model"]:
    """One image's token features: the base tile's patches, then the unpadded grid row by row (with newlines).

    `tiles[0]` is the base image, `tiles[1:]` the grid's tiles in row-major order, each `side²`
    patches. A single tile (an image of a multi-image prompt, which OneVision does not tile) is
    its patches and one newline.
    """
    if tiles.shape[0] == 1:
        if newline is None:
            return tiles[0]
        return torch.cat((tiles[0], newline[None].to(tiles)), dim=0)  # [patches + 1, d_model]
    side = math.isqrt(tiles.shape[1])
    rows, cols = grid_shape(image_size, pinpoints, tile_size)
    grid = tiles[1:].view(rows, cols, side, side, -1)  # [rows, cols, side, side, d]
    grid = grid.permute(4, 0, 2, 1, 3).contiguous().flatten(1, 2).flatten(2, 3)  # [d, rows * side, cols * side]
    grid = unpad(grid, image_size)  # [d, H, W]
    if max_tiles is not None:
        grid = shrink(grid, max_tiles, side)
    if newline is not None:
        column = newline[:, None, None].expand(*grid.shape[:-1], 1).to(grid)  # [d, H, 1]
        grid = torch.cat((grid, column), dim=-1)  # [d, H, W + 1]
    grid = grid.flatten(1, 2).transpose(0, 1)  # [H * (W + 1), d]
    return torch.cat((tiles[0], grid), dim=0)  # [patches + H * (W + 1), d]


def packed_sources(
    n_image_tiles: int,
    patches: int,
    image_size: Sequence[int],
    pinpoints: Sequence[Sequence[int]],
    tile_size: int,
    newline: bool,
    max_tiles: int | None = None,
) -> torch.Tensor:
    """For each token of one packed image, the flat index `tile * patches + patch` of its feature row.

    `NEWLINE` marks a newline token and `INTERPOLATED` a token of a shrunk grid (a blend of patches).
    Computed by packing the indices themselves, so it is the layout `pack_image_features` produces.
    """
    ids = torch.arange(n_image_tiles * patches, dtype=torch.float64).reshape(n_image_tiles, patches, 1)
    mark = torch.tensor([float(NEWLINE)], dtype=torch.float64) if newline else None
    packed = pack_image_features(ids, image_size, pinpoints, tile_size, mark, max_tiles)[:, 0]  # [tokens]
    n_grid_tokens = packed.shape[0] - patches
    grid = packed[patches:]
    expected = _grid_tokens_unshrunk(n_image_tiles, patches, image_size, pinpoints, tile_size, newline)
    if n_image_tiles > 1 and n_grid_tokens != expected:  # shrunk: the grid's values are blends
        grid = torch.where(grid == NEWLINE, grid, torch.full_like(grid, INTERPOLATED))
    return torch.cat((packed[:patches], grid)).long()


def _grid_tokens_unshrunk(n_image_tiles, patches, image_size, pinpoints, tile_size, newline: bool) -> int:
    """Tokens of the grid part before any shrinking (to tell whether `shrink` changed it)."""
    if n_image_tiles == 1:
        return int(newline)
    side = math.isqrt(patches)
    rows, cols = grid_shape(image_size, pinpoints, tile_size)
    probe = unpad(torch.empty(0, rows * side, cols * side), image_size)  # [0, H, W]
    return probe.shape[1] * (probe.shape[2] + int(newline))
