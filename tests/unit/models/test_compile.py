"""`torch.compile(model)`: equal logits, no graph break without hooks, no recompile per length, hooks traced.

Compiling is slow on a small CPU, so the unmarked tests use dynamo's "eager" backend (the
graph is captured and run op by op: graph breaks and recompiles are exactly those of
inductor, the numbers bitwise eager's wherever the same ops run) on two families; inductor's
kernels and the sweep over every family are `slow`. Eagerly, `vocab_projection` projects 2 to
15 positions in BLAS's transposed orientation, which a graph never takes: there the float32
logits may differ in the last bit, so the inputs below unembed 1 or at least 16 positions.
"""

from __future__ import annotations

import pytest
import torch

from tests.tiny_models import EVERY_FAMILY, hooked_from

# the runtime shape checks' wrappers would break the graphs these tests count (tests/README.md)
pytestmark = pytest.mark.unchecked

FAST = ["llama_gqa", "gpt2"]
#: MoE routing sorts tokens by expert and splits them by data-dependent counts: one graph break per MoE layer
MOE = {"mixtral", "olmoe", "qwen2_moe", "qwen3_moe", "gpt_oss"}
MOE |= {"deepseek_v2", "deepseek_v3", "glm_moe_dsa", "glm4_moe", "phimoe", "granitemoe"}  # issue 37
SWEEP = [pytest.param(f, marks=[] if f in FAST else [pytest.mark.slow]) for f in EVERY_FAMILY]
#: The inductor sweep and the static cache's compiled-decode sweep leave out families whose ops another swept
#: family already has: OLMoE and Qwen3-MoE route as Mixtral does (softmax top-k; OLMoE only skips the
#: renormalisation) and attend as OLMo and Qwen3 do. The graph test below still takes every family.
SAME_OPS = {"olmoe", "qwen3_moe"}
DISTINCT_SWEEP = [p for p in SWEEP if p.values[0] not in SAME_OPS]


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


class GraphCounter:
    """A dynamo backend that counts the graphs it is given and runs them as they are."""

    def __init__(self):
        self.graphs = 0

    def __call__(self, gm, example_inputs):
        self.graphs += 1
        return gm.forward


def tokens(n: int = 9, batch: int = 2, seed: int = 0) -> torch.Tensor:
    return torch.randint(3, 90, (batch, n), generator=torch.Generator().manual_seed(seed))


def model(family: str):
    return hooked_from(EVERY_FAMILY[family]())


@pytest.mark.parametrize("family", SWEEP)
def test_compiled_forward_equals_eager_and_is_one_graph(family):
    m, toks = model(family), tokens()
    with torch.no_grad():
        eager = m(toks)
    counter = GraphCounter()
    m.compile(backend=counter, fullgraph=family not in MOE)  # fullgraph: any graph break raises
    with torch.no_grad():
        compiled = m(toks)
    assert torch.equal(compiled, eager)
    if family not in MOE:
        assert counter.graphs == 1


@pytest.mark.parametrize("family", [pytest.param(f, marks=pytest.mark.slow) for f in EVERY_FAMILY if f not in SAME_OPS])
def test_inductor_logits_within_tolerance(family):
    """Inductor's fused kernels reorder float32 sums: logits agree to 1e-4 absolute (see docs/compiled.md)."""
    m, toks = model(family), tokens()
    with torch.no_grad():
        eager = m(toks)
        m.compile()
        compiled = m(toks)
    torch.testing.assert_close(compiled, eager, rtol=1e-4, atol=1e-4)


def test_no_recompile_when_only_the_length_changes():
    m, counter = model("llama_gqa"), GraphCounter()
    m.compile(backend=counter)
    with torch.no_grad():
        for n in (5, 7, 9, 12, 17):
            toks = tokens(n, batch=4)  # >= 16 positions: eager and compiled take the same vocabulary product
            assert torch.equal(m(toks), m.forward(toks))  # model.compile() compiles calls; .forward stays eager
    assert counter.graphs == 2  # the first length, then one graph with a symbolic length (dynamic=None)


def test_mark_dynamic_compiles_once():
    m, counter = model("gpt2"), GraphCounter()
    m.compile(backend=counter)
    with torch.no_grad():
        for n in (5, 8, 13):
            toks = tokens(n)
            torch._dynamo.mark_dynamic(toks, 1)
            m(toks)
    assert counter.graphs == 1


def test_run_with_cache_under_compile_is_traced_and_equal():
    m, ref, toks = model("llama_gqa"), model("llama_gqa"), tokens()
    counter = GraphCounter()
    m.compile(backend=counter, fullgraph=True)
    with torch.no_grad():
        logits, cache = m.run_with_cache(toks)
        ref_logits, ref_cache = ref.run_with_cache(toks)
    assert counter.graphs == 1  # the caching hooks are traced into the graph
    assert torch.equal(logits, ref_logits)
    assert sorted(cache.keys()) == sorted(ref_cache.keys())
    for name in ref_cache:
        assert torch.equal(cache[name], ref_cache[name]), name


def test_hook_added_after_compiling_takes_effect():
    """A hook attached after the first compiled call recompiles (it is never silently skipped)."""
    m, ref, toks = model("llama_gqa"), model("llama_gqa"), tokens()
    counter = GraphCounter()
    m.compile(backend=counter, fullgraph=True)

    def steer(resid, hook):
        return resid + 0.5

    hooks = [("blocks.0.hook_resid_post", steer)]
    with torch.no_grad():
        plain = m(toks)
        steered = m.run_with_hooks(toks, fwd_hooks=hooks)
        again = m(toks)
        expected = ref.run_with_hooks(toks, fwd_hooks=hooks)
    assert torch.equal(steered, expected) and not torch.equal(steered, plain)
    assert torch.equal(again, plain)
    assert counter.graphs == 2  # no hook, then the tensor-op hook traced into one graph


def test_python_hook_breaks_the_graph_but_stays_correct():
    m, ref, toks = model("llama_gqa"), model("llama_gqa"), tokens()
    counter = GraphCounter()
    m.compile(backend=counter)

    def host_sync(resid, hook):
        if resid.abs().max().item() > 0:  # a Python branch on a tensor value: a graph break
            return resid * 2

    hooks = [("blocks.0.hook_resid_post", host_sync)]
    with torch.no_grad():
        out = m.run_with_hooks(toks, fwd_hooks=hooks)
        expected = ref.run_with_hooks(toks, fwd_hooks=hooks)
    assert torch.equal(out, expected)
    assert counter.graphs >= 2


def test_out_of_range_token_still_raises_under_compile():
    m = model("llama_gqa")
    m.compile(backend=GraphCounter(), fullgraph=True)
    bad = tokens()
    bad[0, 3] = m.cfg.d_vocab + 5
    with torch.no_grad(), pytest.raises(RuntimeError, match="outside the vocabulary"):
        m(bad)


def test_repeated_hooked_calls_reuse_the_compiled_graph():
    """Hooks get the same keys each time they are re-added, so the compiled graph's guards match again."""
    m, counter, toks = model("llama_gqa"), GraphCounter(), tokens()
    m.compile(backend=counter)

    def steer(resid, hook):
        return resid + 0.5

    resid_post = lambda name: name.endswith("hook_resid_post")  # noqa: E731
    with torch.no_grad():
        for _ in range(3):
            m.run_with_hooks(toks, fwd_hooks=[("blocks.0.hook_resid_post", steer)])
        assert counter.graphs == 1
        caches = [m.run_with_cache(toks, names_filter=resid_post)[1] for _ in range(3)]
    assert counter.graphs == 2
    for name in caches[0]:
        assert torch.equal(caches[0][name], caches[2][name])


def test_a_stale_handle_never_removes_a_later_hook():
    from hooked.core.hook_points import HookPoint

    hp = HookPoint()
    first = hp.add_hook(lambda x, hook: x + 1)
    first.hook.remove()
    second = hp.add_hook(lambda x, hook: x + 2)  # reuses the freed slot
    first.hook.remove()  # stale: must not touch the second hook
    assert torch.equal(hp(torch.zeros(1)), torch.full((1,), 2.0))
    second.hook.remove()
    assert not hp.observed
