"""Qwen2.5-VL's vision tower and 3-D positions: images at their own resolution, window attention, M-RoPE.

Unlike a CLIP/SigLIP ViT, Qwen2.5-VL's reads each image at (about) its own size: the processor cuts
it into `patch_size`² patches (two frames deep: a still image is repeated), so image i is a grid of
`image_grid_thw[i] = (t, h, w)` patches, and every image's patches are one flat sequence. Positions
are rotary: each patch's row and column rotate half of each head's dimensions (`vision_rotary_tables`).
Most blocks attend only within windows of `window_size` pixels (`window_layout`); the
`full_attention_blocks` attend over each whole image. As HF, the blocks run on the patches in
window order (a window's patches contiguous); `vision.hook_features` puts them back in the
processor's order. The `merger` projector then makes each 2 x 2 square of patches one image token.

In the language model image tokens get 3-D positions (time, row, column: `mrope_positions`), and
the rotary frequencies are split among the three (`mrope_tables`, M-RoPE); text continues after the
largest position of the image before it.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from jaxtyping import Float, Int

from hooked.components.forward_state import ForwardState
from hooked.components.transformer_block import TransformerBlock
from hooked.core.hook_points import HookPoint
from hooked.core.vision_config import VisionLanguageConfig


def vision_positions(grid_thw: Int[torch.Tensor, "images 3"], merge: int) -> Int[torch.Tensor, "patches 2"]:
    """Each patch's (row, column), the patches listed as the processor lists them: merge squares in reading
    order, each square's patches in reading order (HF's `get_vision_position_ids`)."""
    out = []
    for t, h, w in grid_thw.tolist():
        rows, cols = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")  # [h, w] each
        block = (h // merge, merge, w // merge, merge)
        rows = rows.reshape(block).transpose(1, 2).flatten()  # [h * w], merge squares first
        cols = cols.reshape(block).transpose(1, 2).flatten()
        out.append(torch.stack([rows, cols], dim=-1).repeat(t, 1))  # [t * h * w, 2]
    return torch.cat(out)


def window_layout(
    grid_thw: Int[torch.Tensor, "images 3"], merge: int, window: int
) -> tuple[Int[torch.Tensor, "squares"], Int[torch.Tensor, "patches"]]:
    """`(order, window_ids)`: the merge squares in window order (HF's `window_index`), and each patch's window
    in that order (`window` is the window's side in merge squares)."""
    order, windows, first_square, first_window = [], [], 0, 0
    for t, h, w in grid_thw.tolist():
        rows, cols = h // merge, w // merge
        index = torch.arange(t * rows * cols).reshape(t, rows, cols)
        pad_h, pad_w = window - rows % window, window - cols % window
        n_h, n_w = (rows + pad_h) // window, (cols + pad_w) // window
        padded = F.pad(index, (0, pad_w, 0, pad_h), "constant", -100)  # [t, H, W]
        padded = padded.reshape(t, n_h, window, n_w, window).permute(0, 1, 3, 2, 4).reshape(t, n_h * n_w, -1)
        sizes = (padded != -100).sum(-1).reshape(-1)  # squares per window
        order.append(padded.reshape(-1)[padded.reshape(-1) != -100] + first_square)
        ids = torch.arange(first_window, first_window + len(sizes)).repeat_interleave(sizes * merge * merge)
        windows.append(ids)  # [squares * merge², ] per patch
        first_square, first_window = first_square + t * rows * cols, first_window + len(sizes)
    return torch.cat(order), torch.cat(windows)


def image_ids(grid_thw: Int[torch.Tensor, "images 3"]) -> Int[torch.Tensor, "patches"]:
    """The image (a frame of a video counts alone, as HF's `cu_seqlens`) each patch belongs to."""
    per_frame = torch.repeat_interleave(grid_thw[:, 1] * grid_thw[:, 2], grid_thw[:, 0])  # [frames]
    return torch.arange(len(per_frame)).repeat_interleave(per_frame)


def vision_rotary_tables(
    positions: Int[torch.Tensor, "patches 2"], d_head: int, base: float
) -> tuple[Float[torch.Tensor, "patches d_head"], Float[torch.Tensor, "patches d_head"]]:
    """Axial 2-D rotary, float32: a quarter of the frequencies for the row, a quarter for the column, twice."""
    quarter = d_head // 2
    inv_freq = 1.0 / (base ** (torch.arange(0, quarter, 2, dtype=torch.float) / quarter))  # [d_head / 4]
    angles = positions[..., None].float() * inv_freq  # [patches, 2, d_head / 4]
    tables = []
    for values in (angles.cos(), angles.sin()):
        rows_cols = torch.cat([values[:, 0], values[:, 1]], dim=-1)  # [patches, d_head / 2]
        tables.append(torch.cat([rows_cols, rows_cols], dim=-1))  # [patches, d_head]
    return tables[0], tables[1]


class QwenPatchEmbed(nn.Module):
    """`W_patch` `[d_model, channels, frames, patch, patch]`: one vector per patch (a stride-sized 3-D convolution)."""

    def __init__(self, vcfg: VisionLanguageConfig):
        super().__init__()
        cfg, p, t = vcfg.vision, vcfg.patch_size, vcfg.temporal_patch_size
        self.shape = (vcfg.num_channels, t, p, p)
        self.W_patch = nn.Parameter(torch.empty(cfg.d_model, *self.shape, dtype=cfg.dtype))
        self.hook_patch_embed = HookPoint()  # [patches, d_model]

    def forward(self, pixel_values: Float[torch.Tensor, "patches flat"]) -> Float[torch.Tensor, "patches d_model"]:
        patches = pixel_values.view(-1, *self.shape).to(self.W_patch.dtype)  # [patches, C, T, P, P]
        out = F.conv3d(patches, self.W_patch, stride=self.shape[1:])  # [patches, d, 1, 1, 1]
        return self.hook_patch_embed(out.view(len(out), -1))


class QwenVisionTower(nn.Module):
    """Qwen2.5-VL's ViT: patch embedding, then RMSNorm blocks with 2-D rotary attention in windows or images.

    `forward(pixel_values, grid_thw)` returns the last block's output per patch, in the processor's order
    (`hook_features`); the blocks' hooks see the patches in window order (`window_layout`).
    """

    def __init__(self, vcfg: VisionLanguageConfig):
        super().__init__()
        self.vcfg, cfg = vcfg, vcfg.vision
        self.embed = QwenPatchEmbed(vcfg)
        self.hook_embed = HookPoint()  # [1, patches, d_model], window order
        self.blocks = nn.ModuleList([TransformerBlock(cfg, layer) for layer in range(cfg.n_layers)])
        self.hook_features = HookPoint()  # [patches, d_model], the processor's order

    def forward(
        self, pixel_values: Float[torch.Tensor, "patches flat"], grid_thw: Int[torch.Tensor, "images 3"]
    ) -> Float[torch.Tensor, "patches d_model"]:
        vcfg, merge = self.vcfg, self.vcfg.spatial_merge_size
        grid_thw = grid_thw.cpu()
        assert vcfg.window_size is not None and vcfg.vision_rotary_base is not None  # a Qwen2.5-VL config
        order, windows = window_layout(grid_thw, merge, vcfg.window_size // merge // vcfg.patch_size)
        x = self.embed(pixel_values)  # [patches, d_model]
        n, square = len(x), merge * merge
        to_windows = lambda t: t.reshape(n // square, square, -1)[order].reshape(n, -1)  # noqa: E731
        residual = self.hook_embed(to_windows(x)[None])  # [1, patches, d_model]
        cos, sin = vision_rotary_tables(vision_positions(grid_thw, merge), vcfg.vision.d_head, vcfg.vision_rotary_base)
        tables = (to_windows(cos)[None, :, None].to(x.device), to_windows(sin)[None, :, None].to(x.device))
        states = {
            full: self._state(n, residual.device, blocks, tables)
            for full, blocks in ((False, windows), (True, to_windows(image_ids(grid_thw)[:, None])[:, 0]))
        }
        for layer, block in enumerate(self.blocks):
            residual = block(residual, states[layer in vcfg.full_attention_blocks])
        back = torch.argsort(order)  # merge squares back in the processor's order
        return self.hook_features(residual[0].reshape(n // square, square, -1)[back].reshape(n, -1))

    @staticmethod
    def _state(n: int, device, blocks: torch.Tensor, tables) -> ForwardState:
        """Bidirectional attention within each block (window or image), with the 2-D rotary tables."""
        state = ForwardState.for_input(1, n, device, causal=False)
        state.key_blocks, state.rotary_tables = blocks[None].to(device), tables  # [1, patches]
        return state


def mrope_positions(
    tokens: Int[torch.Tensor, "batch pos"],
    attention_mask: Int[torch.Tensor, "batch pos"] | None,
    image_token_id: int,
    grid_thw: Int[torch.Tensor, "images 3"],
    merge: int,
) -> tuple[Int[torch.Tensor, "3 batch pos"], Int[torch.Tensor, "batch"]]:
    """3-D positions (HF's `get_rope_index` for images): `(positions, deltas)`.

    Text tokens count on from the last position; an image's tokens get (first, first + row, first + col) with
    `first` where it starts, and the text after it starts at `first + max(rows, cols)`. Padding gets 0.
    `deltas` is each row's largest position + 1 minus its real tokens: a decode step's 1-D position plus it.
    """
    positions = torch.zeros(3, *tokens.shape, dtype=torch.long)
    grids, deltas = iter(grid_thw.tolist()), []
    for row, ids in enumerate(tokens.cpu()):
        real = torch.ones_like(ids, dtype=torch.bool) if attention_mask is None else attention_mask[row].cpu().bool()
        kinds = (ids[real] == image_token_id).tolist()
        pieces, current, start = [], 0, 0
        while start < len(kinds):
            end = start
            while end < len(kinds) and kinds[end] == kinds[start]:
                end += 1
            if not kinds[start]:
                pieces.append(torch.arange(end - start).expand(3, -1) + current)  # [3, run]
                current += end - start
            else:
                t, h, w = next(grids)
                grid = torch.meshgrid(
                    torch.arange(t), torch.arange(h // merge), torch.arange(w // merge), indexing="ij"
                )
                pieces.append(torch.stack(grid).reshape(3, -1) + current)  # [3, t * h * w / merge²]
                current += max(h, w) // merge
            start = end
        flat = torch.cat(pieces, dim=1)  # [3, real tokens]
        positions[:, row, real] = flat
        deltas.append(int(flat.max()) + 1 - len(kinds))
    return positions.to(tokens.device), torch.tensor(deltas, device=tokens.device)


def mrope_tables(
    positions: Int[torch.Tensor, "3 batch pos"], inv_freq: Float[torch.Tensor, "half"], section, dtype
) -> tuple[Float[torch.Tensor, "batch pos 1 d_head"], Float[torch.Tensor, "batch pos 1 d_head"]]:
    """M-RoPE's cos and sin: frequency block i (of `section`'s sizes) turns with position stream i % 3."""
    angles = positions[..., None].float() * inv_freq.float()  # [3, batch, pos, half]
    tables = []
    for values in (angles.cos(), angles.sin()):
        mixed = torch.cat([block[i % 3] for i, block in enumerate(values.split(list(section), dim=-1))], dim=-1)
        tables.append(torch.cat([mixed, mixed], dim=-1).to(dtype)[:, :, None])  # [batch, pos, 1, d_head]
    return tables[0], tables[1]
