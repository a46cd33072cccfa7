"""The recurrent mixers' state: built only when observed, edits carried by the recurrence, state patching.

Mamba (selective scan), Mamba-2 (SSD) and gated DeltaNet each expose `blocks.{l}.mixer.hook_ssm_state`;
tiny HF-converted models (`tests/tiny_models.py`, `SSM_CONFIGS`) are the subjects.
"""

from __future__ import annotations

import pytest
import torch

from hooked.generation.kv_cache import HookedTransformerKeyValueCache
from tests.helpers import max_abs
from tests.tiny_models import hooked_from, tiny_ssm, tokens

torch.set_num_threads(1)

ATOL = 1e-5
#: state shape after [batch, pos] per mixer of the tiny configs
STATE_SHAPES = {"mamba": (64, 8), "mamba2": (8, 8, 16), "qwen3_5": (4, 8, 6)}
#: a 2-layer model of each mixer kind whose last layer is recurrent (nothing after it mixes positions)
LAST_RECURRENT = {
    "mamba": dict(),
    "mamba2": dict(),
    "qwen3_5": dict(num_hidden_layers=2, layer_types=["full_attention", "linear_attention"]),
}


@pytest.fixture(scope="module", params=list(LAST_RECURRENT))
def subject(request):
    name = request.param
    return name, hooked_from(tiny_ssm(name, **LAST_RECURRENT[name]))


def _state_hook(model) -> str:
    return f"blocks.{model.cfg.recurrent_layers[-1]}.mixer.hook_ssm_state"


def test_the_state_is_built_only_when_observed(subject, monkeypatch):
    import hooked.components.recurrent_state as recurrent_state

    name, model = subject
    calls = []
    original = recurrent_state.hooked_states

    def counting(hook, materialise, propagate):
        return original(hook, lambda: calls.append(hook.name) or materialise(), propagate)

    monkeypatch.setattr(recurrent_state, "hooked_states", counting)
    for module in ("mamba", "mamba2", "gated_deltanet"):
        monkeypatch.setattr(f"hooked.components.{module}.hooked_states", counting)
    t = tokens(2, 12)
    with torch.no_grad():
        plain = model(t)
        assert calls == []
        logits, cache = model.run_with_cache(t, names_filter=lambda n: n.endswith("hook_ssm_state"))
    assert calls == [f"blocks.{layer}.mixer.hook_ssm_state" for layer in model.cfg.recurrent_layers]
    assert torch.equal(logits, plain)  # read-only observers: the fast path's outputs, bit for bit
    assert tuple(cache[_state_hook(model)].shape) == (2, 12, *STATE_SHAPES[name])


def test_the_last_cached_state_is_what_a_cache_carries(subject):
    """The materialised recurrence (one position at a time) ends where the chunked fast path ends."""
    _, model = subject
    t = tokens(2, 20)
    cache = HookedTransformerKeyValueCache.init_cache(model.cfg, batch_size=2)
    with torch.no_grad():
        _, acts = model.run_with_cache(t, names_filter=lambda n: n.endswith("hook_ssm_state"))
        model(t, past_kv_cache=cache)
    for layer in model.cfg.recurrent_layers:
        assert max_abs(acts[f"blocks.{layer}.mixer.hook_ssm_state"][:, -1], cache[layer].ssm_state) <= ATOL


def test_the_materialised_path_equals_the_fast_path(subject):
    """A backward hook on the state makes every output come from the materialised states."""
    _, model = subject
    t = tokens(2, 20)
    seen = []
    with torch.no_grad():
        fast = model(t)
    with model.hooks(bwd_hooks=[(_state_hook(model), lambda grad, hook: seen.append(grad.shape))]):
        materialised = model(t)
        materialised[:, -1].sum().backward()
    assert seen  # the gradient reached the state: the outputs were read from it
    assert max_abs(materialised.detach(), fast) <= ATOL


def _edit_at(t_edit: int, scale: float = 0.5):
    def edit(state, hook):
        state = state.clone()
        state[:, t_edit] += scale * torch.randn(state[:, t_edit].shape, generator=torch.Generator().manual_seed(0))
        return state

    return edit


def test_a_state_edit_changes_later_positions_only(subject):
    _, model = subject
    t, t_edit = tokens(2, 16), 6
    with torch.no_grad():
        plain = model(t)
        edited = model.run_with_hooks(t, fwd_hooks=[(_state_hook(model), _edit_at(t_edit))])
    assert max_abs(edited[:, :t_edit], plain[:, :t_edit]) <= ATOL
    # the edit is read at t and carried on, decaying (Mamba's per-channel decays forget it within a few steps)
    assert all((edited[:, p] - plain[:, p]).abs().max() > 1e-3 for p in range(t_edit, t_edit + 3))


def test_a_state_edit_propagates_as_the_recurrence_says(subject):
    """Editing the state at t equals continuing the rest of the sequence from a cache whose state was edited."""
    _, model = subject
    t, t_edit = tokens(1, 16), 6
    layer = model.cfg.recurrent_layers[-1]
    delta = {}

    def record(state, hook):
        edited = _edit_at(t_edit)(state, hook)
        delta["e"] = (edited - state)[:, t_edit]
        return edited

    with torch.no_grad():
        hooked = model.run_with_hooks(t, fwd_hooks=[(_state_hook(model), record)])
        cache = HookedTransformerKeyValueCache.init_cache(model.cfg, batch_size=1)
        model(t[:, : t_edit + 1], past_kv_cache=cache)
        cache[layer].ssm_state = cache[layer].ssm_state + delta["e"]  # the same edit, written into the cache
        continued = model(t[:, t_edit + 1 :], past_kv_cache=cache)
    assert max_abs(hooked[:, t_edit + 1 :], continued) <= ATOL


@pytest.mark.parametrize("name", ["mamba", "mamba2", "qwen3_next_moe", "lfm2", "granite_hybrid_moe", "nemotron_h"])
def test_state_patching_continues_b_from_a(name):
    """Run prompt A with a cache, continue prompt B's suffix from it: equal to A's prefix + B's suffix."""
    model = hooked_from(tiny_ssm(name))
    a, b, t = tokens(2, 14, seed=1), tokens(2, 14, seed=2), 8
    cache = HookedTransformerKeyValueCache.init_cache(model.cfg, batch_size=2)
    with torch.no_grad():
        model(a[:, :t], past_kv_cache=cache)
        continued = model(b[:, t:], past_kv_cache=cache)
        spliced = model(torch.cat([a[:, :t], b[:, t:]], dim=1))
    assert max_abs(continued, spliced[:, t:]) <= ATOL


def test_states_written_into_another_cache_carry_over():
    """Writing A's conv and recurrent states into B's cache makes B continue exactly as A would."""
    model = hooked_from(tiny_ssm("mamba2"))
    a, b, suffix = tokens(1, 9, seed=1), tokens(1, 9, seed=2), tokens(1, 5, seed=3)
    caches = {}
    with torch.no_grad():
        for key, prompt in (("a", a), ("b", b)):
            caches[key] = HookedTransformerKeyValueCache.init_cache(model.cfg, batch_size=1)
            model(prompt, past_kv_cache=caches[key])
        for layer in model.cfg.recurrent_layers:
            caches["b"][layer].ssm_state = caches["a"][layer].ssm_state.clone()
            caches["b"][layer].conv_state = caches["a"][layer].conv_state.clone()
        patched = model(suffix, past_kv_cache=caches["b"])
        expected = model(torch.cat([a, suffix], dim=1))[:, 9:]
    assert max_abs(patched, expected) <= ATOL


@pytest.mark.parametrize("name", ["mamba", "mamba2", "qwen3_next_moe", "lfm2"])
def test_a_prompt_fed_in_pieces_equals_one_forward(name):
    """Chunked prefill: each piece continues from the conv window and state the previous one left."""
    model = hooked_from(tiny_ssm(name))
    t = tokens(2, 21)
    cache = HookedTransformerKeyValueCache.init_cache(model.cfg, batch_size=2)
    with torch.no_grad():
        full = model(t)
        pieces = [model(t[:, i:j], past_kv_cache=cache) for i, j in ((0, 2), (2, 11), (11, 12), (12, 21))]
    assert max_abs(torch.cat(pieces, dim=1), full) <= ATOL


def test_a_frozen_cache_keeps_its_states():
    model = hooked_from(tiny_ssm("mamba2"))
    cache = HookedTransformerKeyValueCache.init_cache(model.cfg, batch_size=1)
    with torch.no_grad():
        model(tokens(1, 6), past_kv_cache=cache)
        before = cache.clone()
        cache.freeze()
        first = model(tokens(1, 3, seed=4), past_kv_cache=cache)
        second = model(tokens(1, 3, seed=4), past_kv_cache=cache)
    assert torch.equal(first, second)
    for layer in model.cfg.recurrent_layers:
        assert torch.equal(cache[layer].ssm_state, before[layer].ssm_state)
        assert torch.equal(cache[layer].conv_state, before[layer].conv_state)
