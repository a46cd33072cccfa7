"""hooked.analysis.interventions: each intervention equals the hand-written hook it stands for, and
survives a round trip through its data form (spec + tensors)."""

from __future__ import annotations

import pytest
import torch

from hooked.analysis import interventions as iv
from hooked.core.errors import InputError
from tests.tiny_models import hooked_from, make_tokenizer, tiny_gpt2


@pytest.fixture(scope="module")
def model():
    return hooked_from(tiny_gpt2(), tokenizer=make_tokenizer())


@pytest.fixture(scope="module")
def tokens(model):
    torch.manual_seed(1)
    return torch.randint(0, model.cfg.d_vocab, (3, 7))


D = 64
G = torch.Generator().manual_seed(0)
VEC = torch.randn(D, generator=G)
Z = "blocks.0.attn.hook_z"
R = "blocks.1.hook_resid_pre"
P = "blocks.0.attn.hook_pattern"


def _hand_zero_heads(act, hook):
    act = act.clone()
    act[:, :, [1, 3]] = 0
    return act


def _hand_add_last(act, hook):
    act = act.clone()
    act[:, -1] += 2.5 * VEC
    return act


def _hand_mean_pos(act, hook):
    act = act.clone()
    act[:, 2] = act.mean(0)[2]
    return act


def _hand_resample(act, hook):
    return act[[2, 0, 1]].clone()


def _hand_patch_prompt(act, hook):
    act = act.clone()
    act[1:, :, 0] = act[0:1, :, 0]
    return act


def _hand_scale_rows(act, hook):
    act = act.clone()
    act[1] *= 3.0
    return act


def _hand_clamp(act, hook):
    return act.clamp(-0.5, 0.25)


def _hand_project(act, hook):
    d = VEC / VEC.norm()
    return act - (act @ d)[..., None] * d


def _hand_set(act, hook):
    act = act.clone()
    act[:, 0] = VEC
    return act


def _hand_pattern_head(act, hook):
    act = act.clone()
    act[:, 2, 3:5] = 0
    return act


CASES = [
    (Z, iv.zero_ablate(heads=[1, 3]), _hand_zero_heads),
    (R, iv.add(VEC, scale=2.5, positions=[-1]), _hand_add_last),
    (R, iv.mean_ablate(positions=2), _hand_mean_pos),
    (R, iv.resample_ablate(source_rows=[2, 0, 1]), _hand_resample),
    (Z, iv.patch_prompt(0, rows=[1, 2], heads=[0]), _hand_patch_prompt),
    (R, iv.scale(3.0, rows=1), _hand_scale_rows),
    (R, iv.clamp(-0.5, 0.25), _hand_clamp),
    (R, iv.project_out(VEC), _hand_project),
    (R, iv.set_to(VEC, positions=0), _hand_set),
    (P, iv.zero_ablate(heads=2, positions=[3, 4]), _hand_pattern_head),
]


@pytest.mark.parametrize("name,intervention,hand", CASES, ids=[c[1].op for c in CASES])
def test_equals_hand_written_hook(model, tokens, name, intervention, hand):
    expected = model.run_with_hooks(tokens, fwd_hooks=[(name, hand)])
    got = model.run_with_hooks(tokens, fwd_hooks=[(name, intervention)])
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    rebuilt = iv.from_spec(*intervention.to_spec())
    assert torch.equal(model.run_with_hooks(tokens, fwd_hooks=[(name, rebuilt)]), got)


def test_patch_cache_equals_cached_activation(model, tokens):
    _, clean = model.run_with_cache(tokens.flip(0), names_filter=R)
    hand = lambda act, hook: torch.cat([clean[R][:, :3], act[:, 3:]], dim=1)  # noqa: E731
    expected = model.run_with_hooks(tokens, fwd_hooks=[(R, hand)])
    got = model.run_with_hooks(tokens, fwd_hooks=[(R, iv.patch_cache(clean[R], positions=[0, 1, 2]))])
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_chain_applies_in_order(model, tokens):
    both = iv.zero_ablate(positions=0).then(iv.add(VEC, scale=1.0, positions=0))
    expected = model.run_with_hooks(tokens, fwd_hooks=[(R, _hand_set)])
    torch.testing.assert_close(model.run_with_hooks(tokens, fwd_hooks=[(R, both)]), expected, rtol=1e-5, atol=1e-5)
    spec, tensors = both.to_spec()
    assert spec["op"] == "chain" and len(spec["items"]) == 2
    assert torch.equal(
        model.run_with_hooks(tokens, fwd_hooks=[(R, iv.from_spec(spec, tensors))]),
        model.run_with_hooks(tokens, fwd_hooks=[(R, both)]),
    )


def test_steps_select_generation_steps(model):
    prompt = torch.tensor([[5, 6, 7, 8]])
    kwargs = dict(max_new_tokens=4, do_sample=False, verbose=False, stop_at_eos=False)
    seen = []

    def hand(act, hook):
        step = model.forward_state.step
        seen.append(step)
        return act * 0 if step == 2 else act

    expected = model.generate(prompt, fwd_hooks=[(R, hand)], **kwargs)
    got = model.generate(prompt, fwd_hooks=[(R, iv.zero_ablate(steps=[2]))], **kwargs)
    assert seen == [0, 1, 2, 3] and torch.equal(got, expected)
    assert not torch.equal(got, model.generate(prompt, **kwargs))


@pytest.mark.unchecked  # fullgraph: the runtime shape checks' wrappers would break the graph
def test_compiles_without_graph_breaks(model):
    act = torch.randn(2, 5, 4, 16)

    class Hook:
        name, pos_axis = Z, 1

    fn = iv.chain(iv.zero_ablate(heads=[1], positions=[-1]), iv.add(torch.ones(16), scale=0.5, rows=[0]))
    compiled = torch.compile(lambda x: fn(x, Hook()), fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(act), fn(act, Hook()))


@pytest.mark.parametrize(
    "spec,match",
    [
        ({"op": "os.system"}, "unknown intervention op"),
        ({"op": "add", "tensor": "missing"}, "lacks"),
        ({"op": "zero_ablate", "__class__": "x"}, "no field"),
        ({"op": "scale", "factor": "1+1"}, "finite number"),
        ({"op": "scale", "factor": float("nan")}, "finite number"),
        ({"op": "zero_ablate", "heads": ["__import__('os')"]}, "at most 4096 ints"),
        ({"op": "chain", "items": [{"op": "chain", "items": []}]}, "cannot nest"),
        ("zero_ablate", "must be an object"),
    ],
)
@pytest.mark.unchecked  # a wrongly typed argument on purpose: the library's own error, which the checks would preempt
def test_from_spec_refuses_anything_else(spec, match):
    with pytest.raises(InputError, match=match):
        iv.from_spec(spec, {})


def test_bad_selection_names_the_problem(model, tokens):
    with pytest.raises(Exception, match="no head axis"):
        model.run_with_hooks(tokens, fwd_hooks=[(R, iv.zero_ablate(heads=[0]))])
    with pytest.raises(Exception, match="out of range"):
        model.run_with_hooks(tokens, fwd_hooks=[(R, iv.zero_ablate(positions=[40]))])
