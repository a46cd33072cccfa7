"""components/hubert.py: frame masks, the positional convolution's padding, and the block called
TransformerLens-style."""

from __future__ import annotations

import torch

from hooked.components.forward_state import ForwardState
from hooked.components.hubert import AudioFrontendConfig, HubertBlock, PositionalConv, frame_mask
from hooked.core.config import HookedTransformerConfig
from tests.tiny_models import tiny_hubert


def hubert_cfg() -> HookedTransformerConfig:
    return HookedTransformerConfig(
        d_model=32,
        d_head=8,
        n_heads=4,
        n_layers=1,
        n_ctx=1 << 20,
        d_mlp=64,
        act_fn="gelu",
        attention_dir="bidirectional",
    )


def test_frame_mask_equals_hf():
    hf = tiny_hubert(0)
    audio = AudioFrontendConfig(conv_dim=[16] * 3, conv_kernel=[10, 3, 2], conv_stride=[5, 2, 2])
    sample_mask = torch.zeros(4, 900, dtype=torch.long)
    for row, n in enumerate((900, 611, 37, 400)):
        sample_mask[row, :n] = 1
    n_frames = int(audio.output_lengths(torch.tensor(900)))
    theirs = hf._get_feature_vector_attention_mask(n_frames, sample_mask)
    assert torch.equal(frame_mask(sample_mask, n_frames, audio), theirs.long())


def test_positional_conv_keeps_the_number_of_frames():
    for kernel in (7, 8):
        conv = PositionalConv(
            hubert_cfg(), AudioFrontendConfig(num_conv_pos_embeddings=kernel, num_conv_pos_embedding_groups=4)
        )
        torch.nn.init.normal_(conv.W)
        assert conv(torch.randn(2, 11, 32)).shape == (2, 11, 32)


def test_block_takes_transformer_lens_additive_mask():
    torch.manual_seed(0)
    block = HubertBlock(hubert_cfg(), 0)
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(0.0, 0.3)
    x = torch.randn(2, 6, 32)
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]])
    additive = torch.where(mask[:, None, None, :] == 1, 0.0, float("-inf"))  # as TransformerLens builds it
    with torch.no_grad():
        tl_style = block(x, additive)
        with_state = block(x, ForwardState.for_input(2, 6, x.device, mask, causal=False))
        changed = x.clone()
        changed[1, 4:] += 5.0
        masked = block(changed, additive)
    assert torch.equal(tl_style, with_state)
    assert torch.equal(masked[1, :4], tl_style[1, :4])  # padded frames are invisible to the others
