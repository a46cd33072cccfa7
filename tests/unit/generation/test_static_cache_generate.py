"""`generate(..., cache_implementation="static")`: the same tokens as the default cache, compiled or not.

Unmarked tests compile with dynamo's "eager" backend (traced, run op by op: quick, and the
graph count is inductor's); inductor itself and the compiled sweep are `slow`. The static cache
runs eagerly on every family (unmarked: quick); compiled, its decode step is the forward's ops plus the cache's
writes, which follow the attention's module class, so it is traced on the op-kind cover.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from hooked.core.errors import InputError
from hooked.core.utils import at_steps
from hooked.generation.static_cache import AddVector, StaticCacheOptions, compile_safe
from tests.tiny_models import EVERY_FAMILY, hooked_from
from tests.unit.models.test_compile import (  # noqa: F401  (fresh_dynamo: an autouse fixture)
    FAST,
    MOE,
    OP_KIND_COVER,
    GraphCounter,
    fresh_dynamo,
    tokens,
)

# the runtime shape checks' wrappers would break the compiled decode step's graph (tests/README.md)
pytestmark = pytest.mark.unchecked

GREEDY = dict(max_new_tokens=6, do_sample=False, stop_at_eos=False, verbose=False, output_logits=True)


def padded_prompt():
    toks = tokens(7)
    mask = torch.ones_like(toks)
    mask[1, :2] = 0  # row 1 is left-padded
    return toks, mask


def model(family="llama_gqa"):
    return hooked_from(EVERY_FAMILY[family]())


def assert_same_generation(a, b):
    """Identical greedy tokens; logits equal to float32 rounding (the static cache's attention runs over
    every column with a mask, a different SDPA call than the growing cache's, so sums round differently)."""
    assert torch.equal(a.sequences, b.sequences)
    assert len(a.logits) == len(b.logits)
    for x, y in zip(a.logits, b.logits, strict=True):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-5)


#: DSA picks its keys by `topk` over every key column, whose ties (scores of exactly 0) break differently over a
#: static cache's capacity than over the growing cache's length, as in HF: its static generate is compared with
#: HF's static generate instead (tests/acceptance/test_latent_and_routed_parity.py)
TIE_DEPENDENT = {"glm_moe_dsa"}


@pytest.mark.parametrize("family", [f for f in EVERY_FAMILY if f not in TIE_DEPENDENT])  # eager: quick, unmarked
def test_static_equals_dynamic(family):
    m = model(family)
    toks, mask = padded_prompt()
    expected = m.generate(toks, attention_mask=mask, **GREEDY)
    eager = m.generate(toks, attention_mask=mask, cache_implementation="static", compile=False, **GREEDY)
    assert_same_generation(eager, expected)


COMPILED_SWEEP = [pytest.param(f, marks=[] if f in FAST else [pytest.mark.slow]) for f in [*FAST, *OP_KIND_COVER]]


@pytest.mark.parametrize("family", [p for p in COMPILED_SWEEP if p.values[0] not in TIE_DEPENDENT])
def test_compiled_static_decode_equals_eager_static(family):
    m = model(family)
    toks, mask = padded_prompt()
    eager = m.generate(toks, attention_mask=mask, cache_implementation="static", compile=False, **GREEDY)
    counter = GraphCounter()
    options = StaticCacheOptions(backend=counter)
    compiled = m.generate(
        toks, attention_mask=mask, cache_implementation="static", compile=True, static_options=options, **GREEDY
    )
    assert_same_generation(compiled, eager)  # traced ops, but the vocabulary product is not oriented by size
    again = m.generate(
        toks, attention_mask=mask, cache_implementation="static", compile=True, static_options=options, **GREEDY
    )
    assert torch.equal(again.sequences, compiled.sequences)
    if family not in MOE:  # MoE routing breaks the graph
        assert counter.graphs == 1  # one decode-step graph for every step of both calls


@pytest.mark.slow
def test_static_inductor_greedy_tokens_identical():
    """Inductor's kernels for the ops are the forward's (tests/unit/models/test_compile.py); here, its decode step."""
    m = model()
    toks, mask = padded_prompt()
    expected = m.generate(toks, attention_mask=mask, **GREEDY)
    compiled = m.generate(toks, attention_mask=mask, cache_implementation="static", compile=True, **GREEDY)
    assert_same_generation(compiled, expected)


def test_declarative_per_step_hooks_run_compiled():
    m = model()
    toks, mask = padded_prompt()
    vector = torch.randn(m.cfg.d_model, generator=torch.Generator().manual_seed(1))
    steer = AddVector(vector, coefficient=2.0)
    ablate = compile_safe(lambda z, hook: z * 0.0)
    hooks = [("blocks.0.hook_resid_post", steer), ("blocks.1.attn.hook_z", at_steps(ablate, [0, 2, 3]))]
    expected = m.generate(toks, attention_mask=mask, fwd_hooks=hooks, **GREEDY)
    counter = GraphCounter()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # every hook is compile-safe: no fallback warning
        static = m.generate(
            toks, attention_mask=mask, fwd_hooks=hooks, cache_implementation="static", compile=True,
            static_options=StaticCacheOptions(backend=counter), **GREEDY,
        )  # fmt: skip
    assert_same_generation(static, expected)
    assert counter.graphs == 1  # the hooks and the step gate are inside the one compiled step
    hooks = [("blocks.0.hook_resid_post", steer), ("blocks.1.attn.hook_z", at_steps(ablate, [0, 2, 3]))]
    again = m.generate(
        toks, attention_mask=mask, fwd_hooks=hooks, cache_implementation="static", compile=True,
        static_options=StaticCacheOptions(backend=counter), **GREEDY,
    )  # fmt: skip
    assert torch.equal(again.sequences, static.sequences)
    assert counter.graphs == 1  # a second call with the same hooks reuses the graph
    unhooked = m.generate(toks, attention_mask=mask, **GREEDY)
    assert not torch.equal(unhooked.sequences, static.sequences) or not torch.equal(
        unhooked.logits[0], static.logits[0]
    )


def test_python_hook_falls_back_to_eager_with_one_warning():
    m = model()
    toks, mask = padded_prompt()

    def my_python_hook(resid, hook):
        if resid.abs().max().item() > 0:  # a host sync: not declarative
            return resid * 1.5

    hooks = [("blocks.1.hook_resid_post", my_python_hook)]
    expected = m.generate(toks, attention_mask=mask, fwd_hooks=hooks, **GREEDY)
    counter = GraphCounter()
    with pytest.warns(UserWarning, match="'my_python_hook' on 'blocks.1.hook_resid_post'") as record:
        static = m.generate(
            toks, attention_mask=mask, fwd_hooks=hooks, cache_implementation="static", compile=True,
            static_options=StaticCacheOptions(backend=counter), **GREEDY,
        )  # fmt: skip
    assert len([w for w in record if "run eagerly" in str(w.message)]) == 1
    assert counter.graphs == 0  # nothing was compiled
    assert_same_generation(static, expected)


def test_return_cache_fills_preallocated_buffers_equal_to_eager():
    m = model()
    toks, mask = padded_prompt()
    kw = dict(GREEDY, return_cache=True)
    expected = m.generate(toks, attention_mask=mask, **kw)
    static = m.generate(
        toks, attention_mask=mask, cache_implementation="static", compile=True,
        static_options=StaticCacheOptions(backend=GraphCounter()), **kw,
    )  # fmt: skip
    assert sorted(static.cache.keys()) == sorted(expected.cache.keys())
    for name in expected.cache:
        torch.testing.assert_close(static.cache[name], expected.cache[name], rtol=1e-5, atol=1e-5, msg=name)


def test_stop_checked_every_k_steps_gives_the_same_output():
    m = model()
    toks = tokens(5, batch=1)
    free = m.generate(toks, **dict(GREEDY, max_new_tokens=10))
    eos = int(free.sequences[0, 5 + 3])  # the 4th generated token: a stop after step 3
    kw = dict(GREEDY, max_new_tokens=10, stop_at_eos=True, eos_token_id=eos)
    expected = m.generate(toks, **kw)
    for interval in (1, 3, 8):
        options = StaticCacheOptions(stop_check_interval=interval)
        static = m.generate(toks, cache_implementation="static", static_options=options, **kw)
        assert_same_generation(static, expected)
        stream = list(m.generate_stream(toks, cache_implementation="static", static_options=options, **kw))
        assert torch.equal(torch.cat([chunk for chunk in stream], dim=1), expected.sequences[:, 5:])


def test_bad_options_are_refused():
    m, kw = model(), dict(stop_at_eos=False, verbose=False)
    with pytest.raises(InputError, match="cache_implementation='static'"):
        m.generate(tokens(5), compile=True, **kw)
    with pytest.raises(InputError, match="cache_implementation must be"):
        m.generate(tokens(5), cache_implementation="sliding", **kw)
    with pytest.raises(InputError, match="use_past_kv_cache=True"):
        m.generate(tokens(5), cache_implementation="static", use_past_kv_cache=False, **kw)
    with pytest.raises(ValueError, match="stop_check_interval"):
        StaticCacheOptions(stop_check_interval=0)


def test_longrope_switch_is_refused():
    """The tiny Phi-3 switches to LongRoPE's long factors past 16 positions: a static cache cannot
    recompute its keys."""
    m = model("phi3")
    with pytest.raises(InputError, match="LongRoPE"):
        m.generate(tokens(7), cache_implementation="static", **dict(GREEDY, max_new_tokens=12))
