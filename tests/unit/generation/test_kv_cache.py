"""`HookedTransformerKeyValueCache`: buffers, masks, chunked decoding, frozen prefixes and clones."""

import pytest
import torch

from hooked import HookedTransformer, HookedTransformerConfig
from hooked.generation.kv_cache import HookedTransformerKeyValueCache, HookedTransformerKeyValueCacheEntry
from tests.tiny_models import hooked_from, tiny_gpt2

LLAMA_LIKE = dict(
    d_model=64, d_head=16, n_layers=2, n_ctx=128, d_vocab=300, act_fn="silu", normalization_type="RMS",
    positional_embedding_type="rotary", gated_mlp=True, n_key_value_heads=2, seed=0,
)  # fmt: skip


@pytest.fixture(scope="module", params=["gpt2", "llama_like"])
def model(request):
    if request.param == "gpt2":
        return hooked_from(tiny_gpt2())
    return HookedTransformer(HookedTransformerConfig(**LLAMA_LIKE))


def batch(model, b=3, p=12):
    tokens = torch.randint(3, 300, (b, p), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(b, p, dtype=torch.long)
    mask[1, :4] = 0  # left padding
    mask[2, :7] = 0
    return tokens, mask


def new_cache(model, b):
    return HookedTransformerKeyValueCache.init_cache(model.cfg, model.cfg.device, b)


def real(x, mask):
    """Zero out pad positions so comparisons only look at real tokens."""
    return x * mask[..., None]


def test_entry_grows_geometrically_and_keeps_values():
    entry = HookedTransformerKeyValueCacheEntry(2, 3, 4)
    chunks = [torch.randn(2, n, 3, 4) for n in (1, 20, 5, 40)]
    capacities = []
    for chunk in chunks:
        keys, values = entry.update(chunk, -chunk)
        capacities.append(entry._keys.shape[1])
    assert torch.equal(keys, torch.cat(chunks, dim=1)) and torch.equal(values, -keys)
    assert capacities == [16, 32, 32, 66] and entry.length == 66
    preallocated = HookedTransformerKeyValueCacheEntry(2, 3, 4, capacity=70)
    for chunk in chunks:
        preallocated.update(chunk, chunk)
    assert preallocated._keys.shape[1] == 70 and torch.equal(preallocated.past_keys, keys)


@pytest.mark.parametrize("splits", [[12], [5, 1, 6], [1] * 12, [7, 5]])
def test_chunked_decoding_equals_full_forward(model, splits):
    tokens, mask = batch(model)
    full = model(tokens, attention_mask=mask)
    cache, start = new_cache(model, 3), 0
    for n in splits:
        chunk = slice(start, start + n)
        logits = model(tokens[:, chunk], attention_mask=mask[:, chunk], past_kv_cache=cache)
        expected = real(full[:, chunk], mask[:, chunk])
        torch.testing.assert_close(real(logits, mask[:, chunk]), expected, atol=1e-5, rtol=0)
        start += n
    assert cache.n_cached == 12 and cache.n_forwards == len(splits)
    assert torch.equal(cache.previous_attention_mask, mask)


def test_full_mask_with_cache_is_accepted(model):
    tokens, mask = batch(model)
    full = model(tokens, attention_mask=mask)
    cache = new_cache(model, 3)
    model(tokens[:, :8], attention_mask=mask[:, :8], past_kv_cache=cache)
    logits = model(tokens[:, 8:], attention_mask=mask, past_kv_cache=cache)  # the full [b, cached + new] mask
    torch.testing.assert_close(logits, full[:, 8:], atol=1e-5, rtol=0)


def test_frozen_prefix_serves_several_continuations(model):
    tokens, mask = batch(model, p=8)
    prefix = new_cache(model, 3)
    model(tokens, attention_mask=mask, past_kv_cache=prefix)
    prefix.freeze()
    for seed, n in [(1, 1), (2, 4), (3, 2)]:
        continuation = torch.randint(3, 300, (3, n), generator=torch.Generator().manual_seed(seed))
        logits = model(continuation, past_kv_cache=prefix)
        assert model.forward_state.step == 1  # a frozen cache does not count forwards
        whole = torch.cat([tokens, continuation], dim=1)
        whole_mask = torch.cat([mask, torch.ones(3, n, dtype=torch.long)], dim=1)
        torch.testing.assert_close(logits, model(whole, attention_mask=whole_mask)[:, 8:], atol=1e-5, rtol=0)
        assert prefix.n_cached == 8 and prefix[0].length == 8


def test_clone_is_independent(model):
    tokens, mask = batch(model, p=6)
    cache = new_cache(model, 3)
    model(tokens[:, :4], attention_mask=mask[:, :4], past_kv_cache=cache)
    copy = cache.clone()
    a = model(tokens[:, 4:], past_kv_cache=cache)
    b = model(tokens[:, 4:], past_kv_cache=copy)
    torch.testing.assert_close(a, b, atol=0, rtol=0)
    model(tokens[:, 4:5], past_kv_cache=copy)
    assert cache.n_cached == 6 and copy.n_cached == 7 and cache[1].length == 6


def test_step_counts_forwards_and_hooks_see_new_positions(model):
    tokens, mask = batch(model, p=6)
    cache = new_cache(model, 3)
    seen = []
    hooks = [
        ("blocks.1.attn.hook_pattern", lambda x, hook: seen.append(("pattern", model.forward_state.step, x.shape))),
        ("blocks.1.hook_resid_post", lambda x, hook: seen.append(("resid", model.forward_state.step, x.shape))),
    ]
    with model.hooks(hooks):
        model(tokens[:, :4], attention_mask=mask[:, :4], past_kv_cache=cache)
        model(tokens[:, 4:5], past_kv_cache=cache)
        model(tokens[:, 5:6], past_kv_cache=cache)
    H, d = model.cfg.n_heads, model.cfg.d_model
    assert seen == [
        ("pattern", 0, (3, H, 4, 4)), ("resid", 0, (3, 4, d)),
        ("pattern", 1, (3, H, 1, 5)), ("resid", 1, (3, 1, d)),
        ("pattern", 2, (3, H, 1, 6)), ("resid", 2, (3, 1, d)),
    ]  # fmt: skip
    assert model(tokens[:, :2], step=7) is not None and model.forward_state.step == 7
