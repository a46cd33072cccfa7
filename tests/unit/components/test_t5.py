"""components/t5.py: relative position buckets and bias against HF's T5, attention called alone, blocks."""

from __future__ import annotations

import pytest
import torch

from hooked.components.t5 import T5Attention, T5Block, relative_position_bucket
from hooked.core.config import HookedTransformerConfig
from tests.tiny_models import tiny_t5


def t5_cfg(**overrides) -> HookedTransformerConfig:
    fields = dict(
        d_model=32,
        d_head=8,
        n_heads=4,
        n_layers=2,
        n_ctx=64,
        d_mlp=64,
        d_vocab=96,
        act_fn="relu",
        normalization_type="RMS",
        positional_embedding_type="relative_positional_bias",
        use_attn_scale=False,
        attention_dir="bidirectional",
        relative_attention_num_buckets=8,
        relative_attention_max_distance=16,
    )
    fields.update(overrides)
    return HookedTransformerConfig(**fields)


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("num_buckets,max_distance", [(32, 128), (8, 16)])
def test_buckets_equal_hf(bidirectional, num_buckets, max_distance):
    from transformers.models.t5.modeling_t5 import T5Attention as HFT5Attention

    relative = torch.arange(-300, 301)[None, :] - torch.arange(0, 5)[:, None]  # [5, 601]
    ours = relative_position_bucket(relative, bidirectional, num_buckets, max_distance)
    theirs = HFT5Attention._relative_position_bucket(relative, bidirectional, num_buckets, max_distance)
    assert torch.equal(ours, theirs)
    assert int(ours.min()) >= 0 and int(ours.max()) == num_buckets - 1


@pytest.mark.parametrize("stack", ["encoder", "decoder"])
def test_position_bias_equals_hf_compute_bias_with_and_without_past(stack):
    hf = tiny_t5(0)
    hf_attn = getattr(hf, stack).block[0].layer[0].SelfAttention
    attn = T5Attention(t5_cfg(), has_relative_attention_bias=True, is_decoder=stack == "decoder")
    with torch.no_grad():
        attn.rel_pos_bias.weight.copy_(hf_attn.relative_attention_bias.weight)
        for past, n in ((0, 9), (6, 1), (30, 3)):
            theirs = hf_attn.compute_bias(n, past + n, past_seen_tokens=past)
            ours = attn.compute_relative_attention_bias(n, past + n, past_length=past)
            assert torch.equal(ours, theirs), (past, n)


def test_layer_owning_the_bias_needs_it():
    attn = T5Attention(t5_cfg(), has_relative_attention_bias=True)
    x = torch.randn(1, 4, 32)
    with pytest.raises(ValueError, match="position_bias"):
        attn(x, x, x)


def test_relative_bias_needs_its_config_fields():
    with pytest.raises(ValueError, match="relative_attention_num_buckets"):
        T5Attention(t5_cfg(relative_attention_num_buckets=None), has_relative_attention_bias=True)


def _randomized(module: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.normal_(0.0, 0.3)
    return module


def test_decoder_self_attention_is_causal_and_encoder_is_not():
    x = torch.randn(1, 6, 32)
    changed = x.clone()
    changed[:, 4:] += 1.0
    for is_decoder in (True, False):
        attn = _randomized(T5Attention(t5_cfg(), is_decoder=is_decoder))
        with torch.no_grad():
            before, after = attn(x, x, x), attn(changed, changed, changed)
        early_same = torch.equal(before[:, :4], after[:, :4])
        assert early_same == is_decoder


def test_additive_mask_hides_keys():
    attn = _randomized(T5Attention(t5_cfg()))
    x = torch.randn(1, 5, 32)
    y = x.clone()
    y[:, 3:] = torch.randn(1, 2, 32)
    mask = torch.tensor([1, 1, 1, 0, 0])[None, None, None, :]
    additive = (1.0 - mask) * torch.finfo(torch.float32).min
    with torch.no_grad():
        a = attn(x, x, x, additive_attention_mask=additive)
        b = attn(y, y, y, additive_attention_mask=additive)
    torch.testing.assert_close(a[:, :3], b[:, :3], atol=1e-6, rtol=0)


def test_split_qkv_input_block_equals_plain_block():
    plain = _randomized(T5Block(t5_cfg(), 1, is_decoder=True))
    split = T5Block(t5_cfg(use_split_qkv_input=True), 1, is_decoder=True)
    split.load_state_dict(plain.state_dict())
    x, enc = torch.randn(2, 5, 32), torch.randn(2, 7, 32)
    with torch.no_grad():
        torch.testing.assert_close(
            split(x, encoder_hidden_states=enc), plain(x, encoder_hidden_states=enc), atol=1e-5, rtol=0
        )


def test_decoder_block_needs_encoder_states():
    block = T5Block(t5_cfg(), 0, is_decoder=True)
    with pytest.raises(ValueError, match="encoder_hidden_states"):
        block(torch.randn(1, 3, 32), position_bias=torch.zeros(1, 4, 3, 3))
