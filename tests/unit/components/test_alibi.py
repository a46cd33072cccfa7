"""ALiBi (`components/alibi.py`): HF's slopes and biases, padding, both attention paths, the KV cache."""

from __future__ import annotations

import pytest
import torch

from hooked import HookedTransformer, HookedTransformerConfig
from hooked.components.alibi import alibi_bias, alibi_slopes, key_positions
from hooked.components.forward_state import ForwardState

ATOL = 1e-5


@pytest.mark.parametrize("n_heads", [1, 2, 3, 4, 5, 6, 8, 12, 16, 20, 24, 112])
def test_slopes_match_hf_for_any_head_count(n_heads):
    from transformers.models.bloom.modeling_bloom import _get_alibi_slopes

    assert torch.equal(alibi_slopes(n_heads), _get_alibi_slopes(n_heads, torch.device("cpu")))


def test_slopes_of_a_power_of_two_are_geometric():
    assert torch.allclose(alibi_slopes(8), torch.tensor([2.0 ** -(i + 1) for i in range(8)]))


def test_bias_matches_hf_build_alibi_tensor_with_left_padding():
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor

    mask = torch.tensor([[0, 0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1]])
    state = ForwardState(mask, positions=torch.zeros(2, 7, dtype=torch.long), n_queries=7, n_keys=7)
    ours = alibi_bias(state, alibi_slopes(6), torch.float32)  # [batch, head, 1, key]
    theirs = build_alibi_tensor(mask, 6, torch.float32).view(2, 6, 1, 7)
    assert torch.equal(ours, theirs)
    # a left-padded row's real keys get the biases of the prompt alone
    assert torch.equal(key_positions(state)[0, 3:], torch.arange(4.0))


def alibi_model(**overrides) -> HookedTransformer:
    cfg = dict(
        d_model=48, d_head=8, n_heads=6, n_layers=2, n_ctx=64, d_vocab=50, act_fn="gelu_fast",
        positional_embedding_type="alibi", post_embedding_ln=True, seed=0, initializer_range=0.3,
    )  # fmt: skip
    return HookedTransformer(HookedTransformerConfig(**{**cfg, **overrides}))


def test_scores_of_a_left_padded_row_equal_the_prompt_alone():
    """Key positions count real tokens only: the hooked scores (not just the pattern) match."""
    model = alibi_model()
    prompt = torch.randint(0, 50, (1, 5), generator=torch.Generator().manual_seed(0))
    padded = torch.cat([torch.zeros(1, 3, dtype=torch.long), prompt], dim=1)
    mask = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1]])
    name = "blocks.1.attn.hook_attn_scores"
    _, alone = model.run_with_cache(prompt, names_filter=name)
    _, batch = model.run_with_cache(padded, attention_mask=mask, names_filter=name)
    torch.testing.assert_close(batch[name][..., 3:, 3:], alone[name], atol=ATOL, rtol=0)


def test_alibi_changes_the_output_and_sdpa_matches_explicit():
    model = alibi_model()
    t = torch.randint(0, 50, (2, 10), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, 10, dtype=torch.long)
    mask[1, :4] = 0
    fast = model(t, attention_mask=mask)
    model.cfg.attn_implementation = "eager"
    explicit = model(t, attention_mask=mask)
    real = mask.bool()
    torch.testing.assert_close(fast[real], explicit[real], atol=ATOL, rtol=0)
    for block in model.blocks:
        block.attn.alibi_slopes = torch.zeros(6)
    assert (model(t, attention_mask=mask)[real] - explicit[real]).abs().max() > 1e-2


@pytest.mark.parametrize("implementation", ["auto", "eager"])
def test_kv_cached_decoding_equals_full_forward(implementation):
    from hooked.generation.kv_cache import HookedTransformerKeyValueCache

    model = alibi_model(attn_implementation=implementation)
    t = torch.randint(0, 50, (2, 9), generator=torch.Generator().manual_seed(2))
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[0, :3] = 0
    full = model(t, attention_mask=mask)
    cache = HookedTransformerKeyValueCache.init_cache(model.cfg, model.cfg.device, 2)
    start = 0
    for n in (4, 1, 1, 3):
        logits = model(t[:, start : start + n], attention_mask=mask[:, start : start + n], past_kv_cache=cache)
        real = mask[:, start : start + n].bool()
        torch.testing.assert_close(logits[real], full[:, start : start + n][real], atol=ATOL, rtol=0)
        start += n


def test_post_embedding_ln_hooks_fire_before_hook_embed():
    model = alibi_model()
    order = []
    names = ("embed.ln.hook_scale", "embed.ln.hook_normalized", "hook_embed")
    model.run_with_hooks(
        torch.tensor([[1, 2, 3]]), fwd_hooks=[(n, lambda x, hook: order.append(hook.name)) for n in names]
    )
    assert order == list(names)
    assert set(model.embed.state_dict()) == {"W_E", "ln.w", "ln.b"}
