"""Bad hooks, hook lists, name filters and position slices; faults inside hooks; concurrent use."""

from __future__ import annotations

import threading

import pytest
import torch

from hooked import HookNotEnabledError, HookShapeError
from hooked.core.errors import ConcurrentUseError, InputTypeError

TOKENS = torch.tensor([[3, 17, 42, 7]])  # [batch, pos]
RESID = "blocks.0.hook_resid_pre"


def identity(x, hook):
    return None


def test_non_callable_hook(model, unchanged):
    with (
        unchanged(model),
        pytest.raises(InputTypeError, match=r"hook for 'blocks.0.hook_resid_pre' must be callable.* 5"),
    ):
        model.add_hook(RESID, 5)


def test_non_callable_hook_on_a_hook_point(model, unchanged):
    with unchanged(model), pytest.raises(InputTypeError, match="must be callable.*'not a function'"):
        model.hook_dict[RESID].add_hook("not a function")


@pytest.mark.parametrize(
    "fwd_hooks, match",
    [
        ((RESID, identity), r"one bare pair: wrap it as fwd_hooks=\[\('blocks.0.hook_resid_pre', fn\)\]"),
        ([RESID], r"fwd_hooks\[0\] must be a \(name or filter, fn\) pair, got 'blocks.0.hook_resid_pre'"),
        ([(RESID, 3)], r"fwd_hooks\[0\] \(blocks.0.hook_resid_pre\) must be callable.* 3"),
        ([(7, identity)], r"fwd_hooks\[0\]\[0\] must be a hook name .* got 7"),
        ([(RESID, identity, "extra")], r"fwd_hooks\[0\] must be a \(name or filter, fn\) pair"),
        (42, r"fwd_hooks must be a list of \(name or filter, fn\) pairs, got int"),
    ],
    ids=["bare-pair", "name-only", "fn-not-callable", "name-int", "triple", "int"],
)
def test_malformed_fwd_hooks(model, unchanged, fwd_hooks, match):
    with unchanged(model), pytest.raises(InputTypeError, match=match):
        model.run_with_hooks(TOKENS, fwd_hooks=fwd_hooks)


def test_malformed_bwd_hooks(model, unchanged):
    with unchanged(model), pytest.raises(InputTypeError, match=r"bwd_hooks\[0\]"):
        model.run_with_hooks(TOKENS, bwd_hooks=[RESID])


def test_a_bad_pair_after_good_ones_adds_nothing(model, unchanged):
    with unchanged(model), pytest.raises(InputTypeError, match=r"fwd_hooks\[2\]"):
        model.run_with_hooks(TOKENS, fwd_hooks=[(RESID, identity), ("hook_embed", identity), (RESID, None)])


def test_unknown_hook_name(model, unchanged):
    with (
        unchanged(model),
        pytest.raises(KeyError, match=r"blocks.0.hook_resid_pr.*Did you mean: blocks.0.hook_resid_pre"),
    ):
        model.run_with_hooks(TOKENS, fwd_hooks=[("blocks.0.hook_resid_pr", identity)])


def test_disabled_optional_hook(model, unchanged):
    with unchanged(model), pytest.raises(HookNotEnabledError, match="use_attn_result"):
        model.run_with_hooks(TOKENS, fwd_hooks=[("blocks.0.attn.hook_result", identity)])


def test_hook_returning_wrong_shape(model, unchanged):
    with unchanged(model), pytest.raises(HookShapeError, match=r"'blocks.0.hook_resid_pre' returned shape \(1, 4, 3\)"):
        model.run_with_hooks(TOKENS, fwd_hooks=[(RESID, lambda x, hook: x[..., :3])])


def test_hook_returning_a_non_tensor(model, unchanged):
    with unchanged(model), pytest.raises(TypeError, match="returned str"):
        model.run_with_hooks(TOKENS, fwd_hooks=[(RESID, lambda x, hook: "oops")])


def test_exception_inside_a_hook_leaves_nothing_behind(model, unchanged):
    def boom(x, hook):
        raise RuntimeError("boom in blocks.1")

    with unchanged(model), pytest.raises(RuntimeError, match="boom in blocks.1"):
        model.run_with_hooks(TOKENS, fwd_hooks=[(RESID, identity), ("blocks.1.hook_resid_pre", boom)])


def test_exception_inside_nested_contexts(model, unchanged):
    # `with a, b:` enters b inside a: the two hooks contexts are nested
    with (
        unchanged(model),
        pytest.raises(ValueError, match="inner failure"),
        model.hooks(fwd_hooks=[(RESID, identity)]),
        model.hooks(fwd_hooks=[("hook_embed", identity)]),
    ):
        raise ValueError("inner failure")


def test_bad_hook_direction(model, unchanged):
    with unchanged(model), pytest.raises(ValueError, match="'sideways'"):
        model.add_hook(RESID, identity, dir="sideways")


@pytest.mark.parametrize(
    "names_filter, error, match",
    [
        (3, InputTypeError, r"names_filter must be None, a hook name, .* got int \(3\)"),
        ([RESID, 3], InputTypeError, r"names_filter must list hook names as str, got 3"),
        (["blocks.0.hook_resid_prx"], KeyError, r"Did you mean: blocks.0.hook_resid_pre"),
        (2.5, InputTypeError, r"got float \(2.5\)"),
    ],
    ids=["int", "list-with-int", "unknown-name", "float"],
)
def test_bad_names_filter(model, unchanged, names_filter, error, match):
    with unchanged(model), pytest.raises(error, match=match):
        model.run_with_cache(TOKENS, names_filter=names_filter)


@pytest.mark.parametrize(
    "pos_slice, match",
    [
        (0.5, r"pos_slice must be None, an int, .* got 0.5"),
        ("last", r"got 'last'"),
        ((0.0, 2.0), r"pos_slice as a tuple means slice\(start, stop\[, step\]\) of ints or None, got \(0.0, 2.0\)"),
        ([0.5, 1.5], r"pos_slice indices must be ints, got dtype float64"),
        (torch.tensor([0.5]), r"dtype float32"),
        (True, r"got True"),
    ],
    ids=["float", "str", "float-tuple", "float-list", "float-tensor", "bool"],
)
def test_bad_pos_slice(model, unchanged, pos_slice, match):
    with unchanged(model), pytest.raises(InputTypeError, match=match):
        model.run_with_cache(TOKENS, pos_slice=pos_slice)


def test_remove_batch_dim_needs_batch_one(model, unchanged):
    with unchanged(model), pytest.raises(ValueError, match="batch size 1.*batch 2"):
        model.run_with_cache(torch.cat([TOKENS, TOKENS]), remove_batch_dim=True)


def test_incl_bwd_needs_a_scalar(model, unchanged):
    with unchanged(model), pytest.raises(ValueError, match="scalar output: pass return_type='loss'"):
        model.run_with_cache(TOKENS, incl_bwd=True, names_filter=RESID)


# -- threads -----------------------------------------------------------------------------------------
def test_concurrent_use_from_another_thread_raises(model, unchanged):
    """While one thread is inside the model, another thread's call is refused, not silently mixed."""
    entered, release, errors = threading.Event(), threading.Event(), []

    def holder():
        try:
            with model.hooks(fwd_hooks=[(RESID, identity)]):
                entered.set()
                release.wait(10)
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    thread = threading.Thread(target=holder)
    with unchanged(model):
        thread.start()
        assert entered.wait(10)
        try:
            with pytest.raises(ConcurrentUseError, match="already running in another thread"):
                model(TOKENS)
            with pytest.raises(ConcurrentUseError, match="copy.deepcopy"):
                model.run_with_hooks(TOKENS, fwd_hooks=[("hook_embed", identity)])
            with pytest.raises(ConcurrentUseError):  # nor may hooks change under the running call
                model.add_hook(RESID, identity)
            with pytest.raises(ConcurrentUseError):
                model.reset_hooks()
        finally:
            release.set()
            thread.join(10)
    assert not errors


def test_threads_take_turns(model):
    """Sequential use from several threads is fine; a hook may call the model re-entrantly."""
    expected = model(TOKENS)
    results = []
    lock = threading.Lock()

    def run():
        with lock:
            results.append(model(TOKENS))

    threads = [threading.Thread(target=run) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(results) == 3 and all(torch.equal(r, expected) for r in results)

    inner = []

    def reenter(x, hook):
        if not inner:  # same thread: re-entering is allowed
            inner.append(None)
            inner[0] = model(TOKENS[:, :2])

    model.run_with_hooks(TOKENS, fwd_hooks=[(RESID, reenter)])
    assert inner[0].shape == (1, 2, model.cfg.d_vocab_out)


def test_names_filter_generator_is_read_once(model):
    names = (n for n in [RESID, "hook_embed"])
    _, cache = model.run_with_cache(TOKENS, names_filter=names)
    assert set(cache.keys()) == {RESID, "hook_embed"}
