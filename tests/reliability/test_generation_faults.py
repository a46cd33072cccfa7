"""Bad KV caches and bad `generate` arguments: clear errors before any decoding step."""

from __future__ import annotations

import math

import pytest
import torch

from hooked.core.errors import AttentionMaskError, InputError, InputTypeError, KVCacheMismatchError, TokenError
from hooked.generation.kv_cache import HookedTransformerKeyValueCache

TOKENS = torch.tensor([[3, 17, 42, 7]])  # [batch, pos]


def test_kv_cache_with_another_batch_size(model, unchanged):
    cache = HookedTransformerKeyValueCache.init_cache(model.cfg, batch_size=1)
    model(TOKENS, past_kv_cache=cache)
    with (
        unchanged(model),
        pytest.raises(KVCacheMismatchError, match="built for batch size 1, but this input has batch size 2"),
    ):
        model(torch.cat([TOKENS, TOKENS])[:, :1], past_kv_cache=cache)
    assert cache.n_cached == 4  # the refused call did not grow the cache


def test_kv_cache_with_another_layer_count(model, llama, unchanged):
    cfg = model.cfg.to_dict()
    cfg["n_layers"] = 3
    from hooked import HookedTransformerConfig

    cache = HookedTransformerKeyValueCache.init_cache(HookedTransformerConfig.from_dict(cfg))
    with unchanged(model), pytest.raises(KVCacheMismatchError, match="has 3 layers but the model has 2"):
        model(TOKENS, past_kv_cache=cache)


def test_kv_cache_of_another_model(model, llama, unchanged):
    cache = HookedTransformerKeyValueCache.init_cache(llama.cfg)  # 2 layers, but GQA heads of d_head 8
    with unchanged(model), pytest.raises(KVCacheMismatchError, match=r"\[kv_head, d_head\] = \[2, 8\].*\[4, 16\]"):
        model(TOKENS, past_kv_cache=cache)


def test_kv_cache_of_the_wrong_type(model, unchanged):
    with unchanged(model), pytest.raises(InputTypeError, match="HookedTransformerKeyValueCache, got dict"):
        model(TOKENS, past_kv_cache={})


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(max_new_tokens=-1), InputError, "max_new_tokens must be >= 0, got -1"),
        (dict(max_new_tokens=2.5), InputTypeError, r"max_new_tokens must be an int, got float \(2.5\)"),
        (dict(max_new_tokens="5"), InputTypeError, r"max_new_tokens must be an int, got str"),
        (dict(temperature=math.nan), InputError, "temperature must be a finite number >= 0.*nan"),
        (dict(temperature=-1.0), InputError, "temperature .* got -1.0"),
        (dict(temperature=math.inf), InputError, "temperature .* got inf"),
        (dict(top_k=0), InputError, "top_k must be >= 1, got 0"),
        (dict(top_k=2.0), InputTypeError, r"top_k must be an int, got float \(2.0\)"),
        (dict(top_p=1.5), InputError, r"top_p must be a number in \(0, 1\], got 1.5"),
        (dict(top_p=0.0), InputError, r"top_p .* got 0.0"),
        (dict(seed="abc"), InputTypeError, r"seed must be an int, got str \('abc'\)"),
        (dict(seed=1.5), InputTypeError, r"seed must be an int, got float"),
        (dict(eos_token_id=5000), InputError, r"eos_token_id 5000 is outside the vocabulary \[0, 1000\)"),
        (dict(eos_token_id=[1, -2]), InputError, r"eos_token_id -2"),
        (dict(eos_token_id="eos"), InputTypeError, r"eos_token_id must be an int or a list of ints, got 'eos'"),
        (dict(eos_token_id=[]), InputError, "eos_token_id is an empty list"),
        (dict(repetition_penalty=0.0), InputError, "repetition_penalty must be a finite number > 0, got 0.0"),
        (dict(freq_penalty=math.inf), InputError, "freq_penalty must be a finite number, got inf"),
        (dict(return_type="logits"), InputError, r"return_type must be one of .* got 'logits'"),
        (dict(fwd_hooks=("hook_embed", print)), InputTypeError, "one bare pair"),
        (dict(return_cache=True, names_filter=7), InputTypeError, r"names_filter must be None.* got int \(7\)"),
    ],
    ids=["max_new_tokens<0", "max_new_tokens-float", "max_new_tokens-str", "temperature-nan", "temperature<0",
         "temperature-inf", "top_k=0", "top_k-float", "top_p>1", "top_p=0", "seed-str", "seed-float", "eos-range",
         "eos-list-negative", "eos-str", "eos-empty", "repetition_penalty=0", "freq_penalty-inf", "return_type",
         "fwd_hooks-bare-pair", "names_filter-int"],
)  # fmt: skip
def test_bad_generate_arguments(model, unchanged, kwargs, error, match):
    with unchanged(model), pytest.raises(error, match=match):
        model.generate(TOKENS, max_new_tokens=kwargs.pop("max_new_tokens", 2), verbose=False, **kwargs)


def test_generate_with_a_right_padded_mask(model, unchanged):
    mask = torch.tensor([[1, 1, 1, 0]])
    with unchanged(model), pytest.raises(AttentionMaskError, match=r"left padding.*rows \[0\]"):
        model.generate(TOKENS, attention_mask=mask, max_new_tokens=2, verbose=False)


def test_generate_with_a_float_mask(model, unchanged):
    with unchanged(model), pytest.raises(AttentionMaskError, match="dtype torch.float32"):
        model.generate(TOKENS, attention_mask=torch.ones(1, 4), max_new_tokens=2, verbose=False)


def test_generate_with_out_of_range_tokens(model, unchanged):
    with unchanged(model), pytest.raises(TokenError, match="token id 1234"):
        model.generate(torch.tensor([[1, 1234]]), max_new_tokens=2, verbose=False)


def test_generate_with_an_empty_prompt_list(model, unchanged):
    with unchanged(model), pytest.raises(InputError, match="empty list of prompts"):
        model.generate([], max_new_tokens=2, verbose=False)


def test_failing_hook_during_generation_leaves_nothing_behind(model, unchanged):
    def fail_at_step_1(x, hook):
        if model.forward_state.step == 1:
            raise RuntimeError("hook failed at step 1")

    with unchanged(model), pytest.raises(RuntimeError, match="step 1"):
        model.generate(TOKENS, max_new_tokens=3, verbose=False, fwd_hooks=[("hook_embed", fail_at_step_1)])
