"""`components/qwen_vision.py` against HF's own helpers: patch positions, windows, 2-D rotary, 3-D positions, M-RoPE."""

from __future__ import annotations

import pytest
import torch

from hooked.components.qwen_vision import (
    image_ids,
    mrope_positions,
    mrope_tables,
    vision_positions,
    vision_rotary_tables,
    window_layout,
)
from tests.tiny_models import tiny_vlm

torch.set_num_threads(1)

GRIDS = torch.tensor([[1, 6, 10], [1, 8, 8], [1, 4, 2], [2, 4, 6]])  # (t, h, w) in patches


def test_patch_positions_and_windows_are_hfs():
    from transformers.vision_utils import get_vision_cu_seqlens, get_vision_position_ids, get_vision_window_index

    assert torch.equal(vision_positions(GRIDS, 2), get_vision_position_ids(GRIDS, 2))
    for window_px in (28, 56):
        order, windows = window_layout(GRIDS, 2, window_px // 2 // 7)
        hf_order, hf_cu = get_vision_window_index(GRIDS, spatial_merge_size=2, window_size=window_px, patch_size=7)
        assert torch.equal(order, hf_order)
        boundaries = torch.cat([torch.tensor([0]), (windows[1:] != windows[:-1]).nonzero().flatten() + 1])
        assert torch.equal(torch.cat([boundaries, torch.tensor([len(windows)])]), hf_cu.long())
    frames = torch.cat([torch.tensor([0]), (image_ids(GRIDS)[1:] != image_ids(GRIDS)[:-1]).nonzero().flatten() + 1])
    assert torch.equal(
        torch.cat([frames, torch.tensor([int(GRIDS.prod(-1).sum())])]), get_vision_cu_seqlens(GRIDS).long()
    )


def test_vision_rotary_tables_are_hfs():
    hf = tiny_vlm("qwen2_5_vl")
    rotary = hf.model.visual.rotary_pos_emb
    positions = vision_positions(GRIDS, 2)
    theirs = rotary(torch.zeros(1), positions)
    ours = vision_rotary_tables(positions, hf.config.vision_config.hidden_size // 3, 10000.0)
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs, strict=True))


@pytest.mark.parametrize("extra_padding", [0, 3])
def test_3d_positions_and_mrope_tables_are_hfs(extra_padding):
    hf = tiny_vlm("qwen2_5_vl")
    image = 300
    grids = torch.tensor([[1, 6, 10], [1, 4, 4]])  # 3 x 5 and 2 x 2 image tokens
    rows = [[1, 5] + [image] * 15 + [6, 7], [1] + [image] * 4 + [8]]
    width = max(map(len, rows)) + extra_padding  # left padding: the second row always, both with 3
    tokens = torch.tensor([[2] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    ours, deltas = mrope_positions(tokens, mask, image, grids, 2)
    theirs, hf_deltas = hf.model.get_rope_index(
        tokens, mm_token_type_ids=(tokens == image).long(), image_grid_thw=grids, attention_mask=mask
    )
    real = mask.bool()
    assert torch.equal(ours[:, real], theirs[:, real]) and torch.equal(deltas, hf_deltas[:, 0])
    rotary = hf.model.language_model.rotary_emb
    cos, sin = rotary(torch.zeros(1, dtype=torch.float32), ours)
    our_cos, our_sin = mrope_tables(ours, rotary.inv_freq, [2, 1, 1], torch.float32)
    assert torch.equal(our_cos[:, :, 0], cos) and torch.equal(our_sin[:, :, 0], sin)
