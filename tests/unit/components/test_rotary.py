"""Rotary embeddings against a loop-by-loop reference and against HuggingFace's frequency functions."""

from __future__ import annotations

import math

import pytest
import torch

from hooked.components.rotary import apply_rotary, rotary_cos_sin, rotary_inv_freq


def reference_rotary(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor, adjacent: bool) -> torch.Tensor:
    """Rotate each pair of dimensions by `position * inv_freq[k]`, one 2x2 rotation at a time.

    x is `[batch, pos, head, d_head]`; the first `2 * len(inv_freq)` dims rotate. Pair k is
    (2k, 2k+1) for GPT-J's adjacent layout, (k, k + rot/2) for NeoX's half split.
    """
    out = x.clone().double()
    rot = 2 * len(inv_freq)
    for b in range(x.shape[0]):
        for p in range(x.shape[1]):
            for k in range(rot // 2):
                i, j = (2 * k, 2 * k + 1) if adjacent else (k, k + rot // 2)
                angle = positions[b, p].item() * inv_freq[k].item()
                c, s = math.cos(angle), math.sin(angle)
                xi, xj = x[b, p, :, i].double(), x[b, p, :, j].double()
                out[b, p, :, i], out[b, p, :, j] = xi * c - xj * s, xj * c + xi * s
    return out


@pytest.mark.parametrize("adjacent", [False, True])
@pytest.mark.parametrize("d_head,rotary_dim", [(8, 8), (12, 8), (16, 4)])
def test_apply_rotary_matches_reference(adjacent, d_head, rotary_dim):
    torch.manual_seed(0)
    x = torch.randn(2, 7, 3, d_head)
    positions = torch.tensor([[0, 1, 2, 3, 4, 5, 6], [0, 0, 0, 1, 2, 3, 4]])  # second row: left-padded
    inv_freq = rotary_inv_freq(rotary_dim, 10000.0)
    cos, sin = rotary_cos_sin(positions, inv_freq, adjacent, torch.float32)
    ours = apply_rotary(x, cos, sin, adjacent)
    ref = reference_rotary(x, positions, inv_freq, adjacent)
    assert (ours.double() - ref).abs().max().item() <= 1e-5
    assert torch.equal(ours[..., rotary_dim:], x[..., rotary_dim:])  # partial rotary: the rest passes through


@pytest.mark.parametrize("adjacent", [False, True])
def test_scores_depend_only_on_relative_position(adjacent):
    torch.manual_seed(1)
    q, k = torch.randn(1, 1, 1, 8), torch.randn(1, 1, 1, 8)
    inv_freq = rotary_inv_freq(8, 100.0)

    def rotated(x, pos):
        cos, sin = rotary_cos_sin(torch.tensor([[pos]]), inv_freq, adjacent, torch.float32)
        return apply_rotary(x, cos, sin, adjacent)

    first = (rotated(q, 5) * rotated(k, 2)).sum()
    second = (rotated(q, 13) * rotated(k, 10)).sum()
    assert abs(first.item() - second.item()) <= 1e-5


def test_half_split_matches_hf_apply_rotary_pos_emb():
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    config = LlamaConfig(hidden_size=32, num_attention_heads=2, head_dim=16, rope_parameters=dict(rope_theta=500.0))
    torch.manual_seed(2)
    q = torch.randn(2, 5, 2, 16)  # [batch, pos, head, d_head]
    positions = torch.arange(5)[None].expand(2, 5)
    cos_hf, sin_hf = LlamaRotaryEmbedding(config)(q, positions)
    ref, _ = apply_rotary_pos_emb(q, q, cos_hf, sin_hf, unsqueeze_dim=2)
    cos, sin = rotary_cos_sin(positions, rotary_inv_freq(16, 500.0), False, torch.float32)
    assert (apply_rotary(q, cos, sin) - ref).abs().max().item() <= 1e-6


LLAMA3 = dict(rope_type="llama3", low_freq_factor=1.0, high_freq_factor=4.0)
ROPE_CASES = {
    "default": dict(rope_type="default", rope_theta=10000.0),
    "linear": dict(rope_type="linear", factor=4.0, rope_theta=10000.0),
    "llama3_3_1": dict(LLAMA3, factor=8.0, original_max_position_embeddings=8192, rope_theta=5e5),
    "llama3_small_ctx": dict(LLAMA3, factor=32.0, original_max_position_embeddings=128, rope_theta=1e4),
    "linear_partial": dict(rope_type="linear", factor=2.0, rope_theta=10000.0, partial_rotary_factor=0.5),
    "llama3_partial": dict(
        LLAMA3, factor=8.0, original_max_position_embeddings=128, rope_theta=1e4, partial_rotary_factor=0.25
    ),
}


@pytest.mark.parametrize("name", list(ROPE_CASES))
def test_inv_freq_matches_hf_rope_init_functions(name):
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    from hooked.loading.common import hf_rope_parameters

    head_dim = 64
    config = LlamaConfig(
        hidden_size=128,
        num_attention_heads=2,
        head_dim=head_dim,
        max_position_embeddings=131072,
        rope_parameters=dict(ROPE_CASES[name]),
    )
    kind = ROPE_CASES[name]["rope_type"]
    init = LlamaRotaryEmbedding.compute_default_rope_parameters if kind == "default" else ROPE_INIT_FUNCTIONS[kind]
    ref, attention_scaling = init(config)
    assert attention_scaling == 1.0
    base, scaling = hf_rope_parameters(config)
    rotary_dim = int(head_dim * ROPE_CASES[name].get("partial_rotary_factor", 1.0))
    ours = rotary_inv_freq(rotary_dim, base, scaling)
    assert ours.shape == ref.shape
    assert torch.equal(ours, ref)  # same float32 operations in the same order: bitwise equal


def test_llama3_covers_all_three_frequency_bands():
    """The llama3 case above is only meaningful if some frequencies are kept, scaled and blended."""
    s = ROPE_CASES["llama3_small_ctx"]
    inv_freq = rotary_inv_freq(64, s["rope_theta"])
    wavelen = 2 * math.pi / inv_freq
    old = s["original_max_position_embeddings"]
    assert (wavelen < old / s["high_freq_factor"]).any()
    assert (wavelen > old / s["low_freq_factor"]).any()
    assert ((wavelen >= old / s["high_freq_factor"]) & (wavelen <= old / s["low_freq_factor"])).any()


def test_unsupported_rope_type_raises():
    with pytest.raises(NotImplementedError, match="ntk_by_parts"):  # no such kind: converters refuse it first
        rotary_inv_freq(8, 10000.0, {"rope_type": "ntk_by_parts", "factor": 4.0})


def test_scaling_dict_missing_a_field_names_it():
    with pytest.raises(ValueError, match="original_max_position_embeddings"):
        rotary_inv_freq(8, 10000.0, {"rope_type": "yarn", "factor": 4.0})
