"""Every intervention is compile-safe: traced whole under `torch.compile(fullgraph=True)`, and run inside the
compiled decode step of `generate(..., cache_implementation="static", compile=True)` with no fallback to eager.

Compiled with dynamo's "eager" backend (the graph is captured, graph breaks raise under `fullgraph=True`, and the
ops run as traced), as tests/unit/models/test_compile.py explains.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from hooked.analysis import interventions as iv
from hooked.generation.static_cache import StaticCacheOptions, is_compile_safe
from tests.tiny_models import EVERY_FAMILY, hooked_from
from tests.unit.models.test_compile import GraphCounter, fresh_dynamo  # noqa: F401  (autouse fixture)

# torch.compile: the runtime shape checks' wrappers would break the graphs (tests/README.md)
pytestmark = pytest.mark.unchecked

Z = "blocks.1.attn.hook_z"
GEN = torch.Generator().manual_seed(0)
ACT = torch.randn(3, 5, 4, 8, generator=GEN)  # [batch, pos, head, d_head]
VEC = torch.randn(8, generator=GEN)


class Hook:
    name, pos_axis = Z, 1


#: one of each operation (`iv.OPS`), each with a selection, so the masks are traced too
EVERY_OP = {
    "zero_ablate": iv.zero_ablate(heads=[1, 3]),
    "mean_ablate": iv.mean_ablate(positions=[-1]),
    "resample_ablate": iv.resample_ablate(source_rows=[2, 0, 1], heads=0),
    "patch_prompt": iv.patch_prompt(source=1, rows=[0, 2]),
    "set": iv.set_to(VEC, positions=[0, 2]),
    "patch_cache": iv.patch_cache(ACT.flip(0), heads=[2]),
    "add": iv.add(VEC, scale=2.0, rows=[1]),
    "scale": iv.scale(0.5, heads=[0, 1], positions=[1]),
    "clamp": iv.clamp(min=-0.1, max=0.2),
    "project_out": iv.project_out(VEC, positions=[-2, -1]),
}


def test_every_operation_is_listed_and_marked_compile_safe():
    assert set(EVERY_OP) == set(iv.OPS)
    assert all(is_compile_safe(fn) for fn in EVERY_OP.values())
    assert is_compile_safe(iv.chain(*EVERY_OP.values()))
    # an item with steps= reads the step on the host inside a chain: the chain runs eagerly
    assert not is_compile_safe(iv.chain(iv.zero_ablate(), iv.add(VEC, steps=[1])))
    assert not is_compile_safe(lambda x, hook: x)  # a Python function is not, unless marked


@pytest.mark.parametrize("op", sorted(EVERY_OP))
def test_operation_traces_with_fullgraph(op):
    fn = EVERY_OP[op]
    expected = fn(ACT, Hook())
    assert not torch.equal(expected, ACT)  # the intervention changes something
    compiled = torch.compile(lambda x: fn(x, Hook()), fullgraph=True, backend="eager")
    assert torch.equal(compiled(ACT), expected)


def test_chain_of_every_operation_traces_with_fullgraph():
    fn = iv.chain(*EVERY_OP.values())
    compiled = torch.compile(lambda x: fn(x, Hook()), fullgraph=True, backend="eager")
    assert torch.equal(compiled(ACT), fn(ACT, Hook()))


GREEDY = dict(max_new_tokens=5, do_sample=False, stop_at_eos=False, verbose=False, output_logits=True)


def static_hooks(d_model: int) -> list:
    """Every operation that applies at a decode step (not patch_cache: a cached prompt activation has the
    prompt's length), at residual and per-head hook points, one with `steps=`."""
    steer = torch.randn(d_model, generator=torch.Generator().manual_seed(1))
    return [
        ("blocks.0.hook_resid_post", iv.add(steer, scale=3.0)),
        ("blocks.0.attn.hook_z", iv.zero_ablate(heads=[1], steps=[0, 2, 3])),
        ("blocks.1.attn.hook_z", iv.chain(iv.scale(1.5, heads=[0]), iv.clamp(min=-2.0, max=2.0))),
        ("blocks.1.attn.hook_v", iv.mean_ablate(heads=[1])),
        ("blocks.0.hook_mlp_out", iv.project_out(steer)),
        ("blocks.1.hook_resid_pre", iv.resample_ablate(source_rows=[1, 0])),
        ("blocks.1.hook_mlp_out", iv.patch_prompt(source=0, rows=[1], steps=[1, 2, 3])),
        ("blocks.1.hook_resid_mid", iv.set_to(steer * 0.1, positions=[-1], steps=[4])),
    ]


def test_static_generate_runs_every_intervention_compiled():
    m = hooked_from(EVERY_FAMILY["llama_gqa"]())
    toks = torch.randint(3, 90, (2, 7), generator=torch.Generator().manual_seed(0))
    expected = m.generate(toks, fwd_hooks=static_hooks(m.cfg.d_model), **GREEDY)
    counter = GraphCounter()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # every hook is compile-safe: no "run eagerly" warning
        static = m.generate(
            toks, fwd_hooks=static_hooks(m.cfg.d_model), cache_implementation="static", compile=True,
            static_options=StaticCacheOptions(backend=counter), **GREEDY,
        )  # fmt: skip
    assert counter.graphs == 1  # the interventions and their step gates are inside the one compiled step
    assert torch.equal(static.sequences, expected.sequences)
    for x, y in zip(static.logits, expected.logits, strict=True):  # float32 rounding: tests/unit/generation
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-5)
    unhooked = m.generate(toks, **GREEDY)
    assert not torch.allclose(torch.stack(unhooked.logits), torch.stack(static.logits))
