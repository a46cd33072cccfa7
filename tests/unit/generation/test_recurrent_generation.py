"""`generate` on state-space and hybrid models: recurrent caches step by step, hooks on the state at every
step, left-padded batches that write nothing into the state, `return_cache`, streaming, the static cache's refusal."""

from __future__ import annotations

import pytest
import torch

from hooked.core.errors import InputError
from hooked.core.utils import at_steps
from hooked.generation.kv_cache import HookedTransformerKeyValueCache
from tests.helpers import max_abs
from tests.tiny_models import hooked_from, tiny_ssm, tokens

torch.set_num_threads(1)

ATOL = 1e-5
GREEDY = dict(do_sample=False, stop_at_eos=False, verbose=False)
FAMILIES = ["mamba", "mamba2", "qwen3_next_moe", "lfm2", "granite_hybrid_moe"]


@pytest.fixture(scope="module", params=FAMILIES)
def model(request):
    return hooked_from(tiny_ssm(request.param))


def _left_padded(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`[2, len(a)]` tokens (b left-padded with 0s) and their mask."""
    batch = torch.zeros(2, a.shape[1], dtype=torch.long)
    mask = torch.ones_like(batch)
    batch[0], batch[1, -b.shape[1] :] = a[0], b[0]
    mask[1, : a.shape[1] - b.shape[1]] = 0
    return batch, mask


def test_a_left_padded_batch_equals_each_prompt_alone(model):
    a, b = tokens(1, 9, seed=1), tokens(1, 5, seed=2)
    batch, mask = _left_padded(a, b)
    together = model.generate(batch, attention_mask=mask, max_new_tokens=8, output_logits=True, **GREEDY)
    for row, prompt in ((0, a), (1, b)):
        alone = model.generate(prompt, max_new_tokens=8, output_logits=True, **GREEDY)
        assert torch.equal(together.sequences[row, 9:], alone.sequences[0, prompt.shape[1] :])
        assert max_abs(torch.stack(together.logits)[:, row], torch.stack(alone.logits)[:, 0]) <= ATOL


def test_padding_writes_nothing_into_the_state(model):
    """After a left-padded prefill, the padded row's conv window and state are those of its prompt alone."""
    a, b = tokens(1, 9, seed=1), tokens(1, 5, seed=2)
    batch, mask = _left_padded(a, b)
    padded = HookedTransformerKeyValueCache.init_cache(model.cfg, batch_size=2)
    alone = HookedTransformerKeyValueCache.init_cache(model.cfg, batch_size=1)
    with torch.no_grad():
        model(batch, attention_mask=mask, past_kv_cache=padded)
        model(b, past_kv_cache=alone)
    for layer in model.cfg.recurrent_layers:
        assert max_abs(padded[layer].conv_state[1], alone[layer].conv_state[0]) <= ATOL
        if alone[layer].ssm_state is not None:  # LFM2's short convolution has only its window
            assert max_abs(padded[layer].ssm_state[1], alone[layer].ssm_state[0]) <= ATOL


def test_without_the_cache_generation_is_the_same(model):
    t = tokens(2, 6, seed=5)
    cached = model.generate(t, max_new_tokens=6, **GREEDY)
    assert torch.equal(model.generate(t, max_new_tokens=6, use_past_kv_cache=False, **GREEDY), cached)


def test_hooks_see_the_state_at_every_step(model):
    layer = model.cfg.recurrent_layers[0]
    name = f"blocks.{layer}.mixer.hook_{'ssm_state' if model.cfg.mixer_types[layer] != 'short_conv' else 'conv_out'}"
    seen = []
    model.generate(
        tokens(2, 6), max_new_tokens=5, fwd_hooks=[(name, lambda act, hook: seen.append(act.shape[1]))], **GREEDY
    )
    assert seen == [6, 1, 1, 1, 1]  # the prompt at the prefill, then one new position per step


def test_a_hook_at_chosen_steps_changes_the_logits_from_there(model):
    layer = model.cfg.recurrent_layers[0]
    recurrent = model.cfg.mixer_types[layer] != "short_conv"  # LFM2's short convolution has only its window
    name = f"blocks.{layer}.mixer.hook_{'ssm_state' if recurrent else 'conv_out'}"
    t = tokens(1, 6)
    plain = model.generate(t, max_new_tokens=6, output_logits=True, **GREEDY)
    steps = []

    def scramble(act, hook):
        steps.append(model.forward_state.step)
        return -3 * act

    hook = at_steps(scramble, [2, 3])
    edited = model.generate(t, max_new_tokens=6, fwd_hooks=[(name, hook)], output_logits=True, **GREEDY)
    assert steps == [2, 3]
    before, after = torch.stack(plain.logits), torch.stack(edited.logits)  # [step, batch, d_vocab]
    assert torch.equal(after[:2], before[:2])  # the steps before the edit
    assert max_abs(after[2], before[2]) > 1e-3


def test_return_cache_equals_run_with_cache_on_the_fed_sequence(model):
    names = lambda n: n.endswith(("hook_ssm_state", "hook_mixer_out", "hook_resid_post", "hook_conv_out"))  # noqa: E731
    out = model.generate(tokens(2, 6), max_new_tokens=5, return_cache=True, names_filter=names, **GREEDY)
    with torch.no_grad():
        _, reference = model.run_with_cache(out.sequences[:, :-1], names_filter=names)
    assert set(out.cache.keys()) == set(reference.keys())
    for key in reference:
        assert max_abs(out.cache[key], reference[key]) <= ATOL, key


def test_streaming_yields_what_generate_returns(model):
    t = tokens(2, 6, seed=7)
    chunks = list(model.generate_stream(t, max_new_tokens=7, max_tokens_per_yield=3, **GREEDY))
    assert torch.equal(torch.cat(chunks, dim=1), model.generate(t, max_new_tokens=7, **GREEDY)[:, 6:])


def test_the_static_cache_refuses_recurrent_layers(model):
    with pytest.raises(InputError, match="recurrent layers") as error:
        model.generate(tokens(1, 4), max_new_tokens=2, cache_implementation="static", **GREEDY)
    assert "cache_implementation=None" in str(error.value)
