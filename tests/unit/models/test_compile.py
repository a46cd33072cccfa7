"""`torch.compile(model)`: equal logits, no graph break without hooks, no recompile per length, hooks traced.

Compiling is slow on a small CPU, so the unmarked tests use dynamo's "eager" backend (the
graph is captured and run op by op: graph breaks and recompiles are exactly those of
inductor, the numbers bitwise eager's wherever the same ops run) on two families; the sweep over
every family and inductor's kernels (over `OP_KIND_COVER`, the families that together hold every
op kind) are `slow`. Eagerly, `vocab_projection` projects 2 to
15 positions in BLAS's transposed orientation, which a graph never takes: there the float32
logits may differ in the last bit, so the inputs below unembed 1 or at least 16 positions.
"""

from __future__ import annotations

import dataclasses
import numbers

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
#: The fewest families that together hold every op kind any family has (`op_kinds`: each component class, and
#: each configuration switch's setting). Inductor's kernels are a function of the ops and their settings, so the
#: inductor sweep below compiles these, and the static cache's compiled decode step
#: (tests/unit/generation/test_static_cache_generate.py) traces these; the eager-backend graph test above still
#: traces every family. Each family here is the only one with some kind (its comment names one);
#: `test_the_op_kind_cover_holds_every_op_kind` keeps it so when a family is added.
OP_KIND_COVER = [
    "apertus",  # xIELU
    "bloom",  # ALiBi, the post-embedding LayerNorm, Bloom's gelu
    "cohere",  # LayerNorm without bias, per-head qk-norm
    "deepseek_v2",  # multi-head latent attention, group-limited routing
    "falcon_multi_query",  # multi-query attention, the parallel residual
    "gemma3_multimodal",  # the image-text model class around Gemma 3's text blocks
    "gemma3n",  # AltUp, LAuReL, activation sparsity
    "gemma4",  # per-layer head shapes, the layer scalar
    "glm_moe_dsa",  # DeepSeek sparse attention's indexer
    "gpt_neo",  # unscaled attention scores in float32, gelu_new
    "gpt_oss",  # attention sinks, clamped SwiGLU experts
    "granitemoe",  # top-k softmax router, residual multiplier
    "hunyuan",  # qk-norm after rotary
    "mixtral",  # the sparse MoE block
    "mpt",  # ALiBi's bias maximum
    "olmo",  # non-parametric LayerNorm
    "olmo2",  # post-sublayer norms, full-width qk-norm
    "opt",  # relu
    "phimoe",  # sparsemixer routing
    "qwen2_moe",  # the shared expert
    "smollm3",  # layers without rotary
]
_NOT_A_SWITCH = {  # names, sizes and bookkeeping: no op or setting of one
    "model_name", "tokenizer_name", "original_architecture", "device", "seed", "dtype", "initializer_range",
    "checkpoint_index", "checkpoint_label", "checkpoint_value", "tokenizer_prepends_bos", "default_prepend_bos",
    "from_checkpoint", "weight_processing", "init_weights", "init_mode", "eps",
}  # fmt: skip


def op_kinds(m) -> set[str]:
    """What a compiled forward of `m` is made of: its component classes and each configuration switch's setting
    (a flag or a name as it is, a number or a list as zero/empty or set; sizes `d_*`/`n_*` are left out)."""
    kinds = {f"module {type(module).__name__}" for module in m.modules()}
    for f in dataclasses.fields(m.cfg):
        if f.name.startswith(("d_", "n_")) or f.name in _NOT_A_SWITCH:
            continue
        value = getattr(m.cfg, f.name)
        if isinstance(value, (bool, str)) or value is None:
            kinds.add(f"{f.name}={value}")
        elif isinstance(value, numbers.Number):
            kinds.add(f"{f.name}={'0' if value == 0 else 'set'}")
        elif isinstance(value, (tuple, list)):
            kinds.add(f"{f.name}={'empty' if not value else 'set'}")
        else:
            kinds.add(f"{f.name}: {type(value).__name__}")
    return kinds


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


def uncovered(kinds: dict[str, set[str]], sweep: list[str]) -> dict[str, list[str]]:
    """The op kinds no family of `sweep` has, each with the families that have it."""
    covered = set().union(*(kinds[f] for f in sweep))
    return {k: sorted(f for f in kinds if k in kinds[f]) for k in sorted(set().union(*kinds.values()) - covered)}


def test_the_op_kind_cover_holds_every_op_kind():
    kinds = {family: op_kinds(model(family)) for family in EVERY_FAMILY}
    missing = uncovered(kinds, OP_KIND_COVER)
    assert not missing, f"no family of OP_KIND_COVER has these op kinds (add one of their families): {missing}"
    redundant = [f for f in OP_KIND_COVER if not uncovered(kinds, [g for g in OP_KIND_COVER if g != f])]
    assert not redundant, f"OP_KIND_COVER's other families have every op kind of {redundant}: drop them"
    planted = {**kinds, "planted": {"module PlantedAttention"}}
    assert uncovered(planted, OP_KIND_COVER) == {"module PlantedAttention": ["planted"]}


@pytest.mark.parametrize("family", [pytest.param(f, marks=pytest.mark.slow) for f in OP_KIND_COVER])
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


def test_no_recompile_when_only_the_routing_changes():
    """MoE dispatch runs eagerly under compile: new expert counts are no new graphs."""
    m, counter = model("mixtral"), GraphCounter()
    m.compile(backend=counter)
    with torch.no_grad():
        m(tokens(1, batch=1, seed=0))
        first = counter.graphs
        for seed in range(1, 6):  # one token, as a decode step: other tokens pick other experts (counts 0 or 1)
            toks = tokens(1, batch=1, seed=seed)
            assert torch.equal(m(toks), m.forward(toks))
    assert counter.graphs == first


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
