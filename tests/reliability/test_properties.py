"""Property-based invariants (hypothesis): hooks never leak, padding never leaks into real tokens,
processing twice equals processing once, and KV-cached decoding equals the full forward."""

from __future__ import annotations

import warnings

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hooked.generation.kv_cache import HookedTransformerKeyValueCache
from tests.tiny_models import CORPUS, hooked_from, make_tokenizer, tiny_gpt2

SETTINGS = settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
WORDS = sorted({w for line in CORPUS for w in line.split()})
TEXT = st.lists(st.sampled_from(WORDS), min_size=1, max_size=8).map(" ".join)
HOOK_NAMES = ["hook_embed", "hook_pos_embed", "blocks.0.hook_resid_pre", "blocks.0.attn.hook_pattern",
              "blocks.1.mlp.hook_post", "blocks.1.hook_resid_post", "ln_final.hook_scale"]  # fmt: skip
PROBE = torch.tensor([[3, 17, 42, 7, 99, 5]])  # [batch, pos]


@pytest.fixture(scope="module")
def gpt2():
    return hooked_from(tiny_gpt2(), tokenizer=make_tokenizer())


# -- hooks -------------------------------------------------------------------------------------------------
class Boom(Exception):
    pass


def identity(x, hook):
    return None


def explode(x, hook):
    raise Boom(hook.name)


OPS = st.one_of(
    st.tuples(st.just("context"), st.lists(st.sampled_from(HOOK_NAMES), max_size=3), st.booleans()),
    st.tuples(st.just("run_with_hooks"), st.lists(st.sampled_from(HOOK_NAMES), max_size=3), st.booleans()),
    st.tuples(st.just("run_with_cache"), st.lists(st.sampled_from(HOOK_NAMES), min_size=1, max_size=3), st.booleans()),
    st.tuples(st.just("add"), st.sampled_from(HOOK_NAMES), st.booleans()),
    st.tuples(st.just("reset"), st.just(None), st.booleans()),
    st.tuples(st.just("malformed"), st.sampled_from(HOOK_NAMES), st.booleans()),
)


def hook_ids(model) -> set:
    return {(name, id(h.hook), h.is_permanent) for name, hs in model.list_hooks().items() for h in hs}


@SETTINGS
@given(ops=st.lists(OPS, max_size=8))
def test_random_hook_edit_sequences_leave_no_hooks_behind(gpt2, ops):
    """Scoped hook APIs (also when a hook raises or the list is malformed) leave exactly the hooks they found."""
    model = gpt2
    baseline = model(PROBE)
    try:
        for kind, arg, flag in ops:
            before = hook_ids(model)
            if kind == "context":
                with (
                    pytest.raises(Boom) if flag else _nothing(),
                    model.hooks(fwd_hooks=[(n, identity) for n in arg]),
                ):
                    model(PROBE)
                    if flag:
                        raise Boom("inside the context")
            elif kind == "run_with_hooks":
                hooks = [(n, explode if flag and i == 0 else identity) for i, n in enumerate(arg)]
                with pytest.raises(Boom) if flag and arg else _nothing():
                    model.run_with_hooks(PROBE, fwd_hooks=hooks)
            elif kind == "run_with_cache":
                _, cache = model.run_with_cache(PROBE, names_filter=arg, pos_slice=-1 if flag else None)
                assert set(cache.keys()) == set(arg)
            elif kind == "malformed":
                with pytest.raises(TypeError):
                    model.run_with_hooks(PROBE, fwd_hooks=[(arg, identity), (arg, "not callable")])
            if kind in ("context", "run_with_hooks", "run_with_cache", "malformed"):
                assert hook_ids(model) == before
            elif kind == "add":
                model.add_hook(arg, identity, is_permanent=flag)
            else:  # reset: non-permanent hooks go, permanent ones stay
                model.reset_hooks()
                assert hook_ids(model) == {h for h in before if h[2]}
            assert model.context_level == 0
    finally:
        model.reset_hooks(including_permanent=True)
    assert model.list_hooks() == {} and torch.equal(model(PROBE), baseline)


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


# -- padding ---------------------------------------------------------------------------------------------
@SETTINGS
@given(texts=st.lists(TEXT, min_size=1, max_size=4), side=st.sampled_from(["left", "right"]), bos=st.booleans())
def test_random_batches_with_random_padding_equal_per_prompt_runs(gpt2, texts, side, bos):
    tokens, mask = gpt2.to_tokens(texts, prepend_bos=bos, padding_side=side, return_attention_mask=True)
    batched = gpt2(texts, prepend_bos=bos, padding_side=side)  # [batch, pos, d_vocab]
    for row, text in enumerate(texts):
        alone = gpt2(text, prepend_bos=bos)[0]  # [pos, d_vocab]
        torch.testing.assert_close(batched[row][mask[row].bool()], alone, atol=1e-5, rtol=0)


@SETTINGS
@given(data=st.data(), side=st.sampled_from(["left", "right"]))
def test_random_token_batches_with_masks_equal_per_row_runs(llama, data, side):
    """Rotary + GQA model, raw token ids with an explicit mask of random padding."""
    lengths = data.draw(st.lists(st.integers(1, 12), min_size=1, max_size=4))
    width = max(lengths)
    tokens = torch.zeros(len(lengths), width, dtype=torch.long)
    mask = torch.zeros(len(lengths), width, dtype=torch.long)
    rows = [torch.tensor(data.draw(st.lists(st.integers(0, 119), min_size=n, max_size=n))) for n in lengths]
    for i, row in enumerate(rows):
        cols = slice(width - len(row), width) if side == "left" else slice(0, len(row))
        tokens[i, cols], mask[i, cols] = row, 1
    batched = llama(tokens, attention_mask=mask)
    for i, row in enumerate(rows):
        torch.testing.assert_close(batched[i][mask[i].bool()], llama(row[None])[0], atol=1e-5, rtol=0)


# -- processing ------------------------------------------------------------------------------------------
FLAGS = st.fixed_dictionaries(
    {k: st.booleans() for k in ("fold_ln", "center_writing_weights", "center_unembed", "fold_value_biases")}
)


@settings(max_examples=8, deadline=None)
@given(flags=FLAGS, refactor=st.booleans())
def test_processing_is_idempotent(flags, refactor):
    model = hooked_from(tiny_gpt2(), **flags, refactor_factored_attn_matrices=refactor)
    once = {k: v.clone() for k, v in model.state_dict().items()}
    steps = model.cfg.weight_processing
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.process_weights_(**flags, refactor_factored_attn_matrices=refactor)
    twice = model.state_dict()
    assert model.cfg.weight_processing == steps and once.keys() == twice.keys()
    for name, w in once.items():
        assert torch.equal(w, twice[name]), name


# -- KV cache --------------------------------------------------------------------------------------------
@SETTINGS
@given(data=st.data(), which=st.sampled_from(["gpt2", "llama"]))
def test_kv_cached_decoding_equals_the_full_forward(gpt2, llama, data, which):
    model = gpt2 if which == "gpt2" else llama
    n = data.draw(st.integers(2, 20))
    tokens = torch.tensor(data.draw(st.lists(st.integers(0, 119), min_size=n, max_size=n)))[None]  # [1, pos]
    splits = sorted(set(data.draw(st.lists(st.integers(1, n - 1), max_size=4))))
    full = model(tokens)
    cache = HookedTransformerKeyValueCache.init_cache(model.cfg, batch_size=1)
    chunks = [model(tokens[:, a:b], past_kv_cache=cache) for a, b in zip([0, *splits], [*splits, n], strict=True)]
    torch.testing.assert_close(torch.cat(chunks, dim=1), full, atol=1e-5, rtol=0)
    assert cache.n_cached == n
