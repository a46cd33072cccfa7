"""`logit_attrs` and `apply_ln_to_stack` cannot be silently wrong: no double norm, no broadcast over positions."""

import pytest
import torch

from hooked.core.errors import InputError
from tests.unit.analysis.test_cache_analysis import VARIANTS, make_model, run

torch.set_num_threads(1)

NORMED = [k for k, v in VARIANTS.items() if v.get("normalization_type", "LN") is not None]


@pytest.fixture(scope="module", params=NORMED)
def setup(request):
    model = make_model(**VARIANTS[request.param])
    return (model, *run(model))


CORRECT, WRONG = torch.tensor([3, 7]), torch.tensor([11, 5])


def test_a_stack_scaled_by_the_final_norm_is_not_scaled_again(setup):
    _, _, _, cache = setup
    want = cache.logit_attrs(cache.stack_head_results(-1, pos_slice=-1), CORRECT, WRONG, pos_slice=-1)  # [head, batch]
    normed = cache.stack_head_results(layer=-1, pos_slice=-1, apply_ln=True)
    torch.testing.assert_close(cache.logit_attrs(normed, CORRECT, WRONG, pos_slice=-1), want, atol=1e-6, rtol=0)
    torch.testing.assert_close(cache.logit_attrs(normed, CORRECT, WRONG), want, atol=1e-6, rtol=0)
    # a view of the scaled stack (one component range, one sequence) still knows it was scaled
    torch.testing.assert_close(
        cache.logit_attrs(normed[2:5], CORRECT, WRONG, pos_slice=-1), want[2:5], atol=1e-6, rtol=0
    )
    torch.testing.assert_close(
        cache.logit_attrs(normed.detach(), CORRECT, WRONG, pos_slice=-1), want, atol=1e-6, rtol=0
    )
    got = cache.logit_attrs(normed[:, 1:], CORRECT[1:], WRONG[1:], pos_slice=-1)
    torch.testing.assert_close(got, want[:, 1:], atol=1e-6, rtol=0)
    got = cache.logit_attrs(normed, CORRECT[1], WRONG[1], pos_slice=-1, batch_slice=1)
    torch.testing.assert_close(got, want[:, 1], atol=1e-6, rtol=0)
    full = cache.get_full_resid_decomposition(pos_slice=-1, apply_ln=True)
    plain = cache.get_full_resid_decomposition(pos_slice=-1)
    torch.testing.assert_close(
        cache.logit_attrs(full, CORRECT, WRONG, pos_slice=-1), cache.logit_attrs(plain, CORRECT, WRONG, pos_slice=-1),
        atol=1e-5, rtol=0,
    )  # fmt: skip


def test_the_logit_lens_stack_gives_each_layers_logit_difference(setup):
    """`accumulated_resid(apply_ln=True)` went through all of ln_final (gain and bias): used as it is."""
    model, _, _, cache = setup
    lens = cache.logit_lens(pos_slice=-1)  # [component, batch, d_vocab]
    rows = torch.arange(2)
    want = lens[:, rows, CORRECT] - lens[:, rows, WRONG] - (model.b_U[CORRECT] - model.b_U[WRONG])
    got = cache.logit_attrs(cache.accumulated_resid(apply_ln=True, pos_slice=-1), CORRECT, WRONG, pos_slice=-1)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=0)


def test_scaling_twice_or_by_another_layers_norm_is_refused(setup):
    _, _, _, cache = setup
    normed = cache.stack_head_results(layer=-1, pos_slice=-1, apply_ln=True)
    with pytest.raises(InputError, match=r"already scaled by ln_final .*divide it twice"):
        cache.apply_ln_to_stack(normed, -1, pos_slice=-1)
    at_layer1 = cache.decompose_resid(layer=1, pos_slice=-1, apply_ln=True)
    with pytest.raises(InputError, match=r"scaled by blocks\.1\.ln1 .*build the stack with layer=-1"):
        cache.logit_attrs(at_layer1, CORRECT, WRONG, pos_slice=-1)


def test_a_stack_whose_positions_do_not_match_the_scale_is_refused(setup):
    _, _, _, cache = setup
    stack = cache.stack_head_results(layer=-1)  # [head, batch=2, pos=6, d_model]
    with pytest.raises(InputError, match=r"batch/position axes \(2,\), but ln_final's cached scale with pos_slice=None "
                       r"and batch_slice=None has \(2, 6\).*pos_slice=-1"):  # fmt: skip
        cache.logit_attrs(stack[:, :, -1], tokens=CORRECT, incorrect_tokens=WRONG)
    with pytest.raises(InputError, match=r"axes \(2, 6\), but .*pos_slice=-1 and batch_slice=None has \(2,\)"):
        cache.logit_attrs(stack, CORRECT, WRONG, pos_slice=-1)
    with pytest.raises(InputError, match=r"axes \(1, 6\), but .* has \(2, 6\)"):
        cache.apply_ln_to_stack(stack[:, :1], -1)


def test_tokens_that_would_broadcast_the_stack_are_refused(setup):
    _, tokens, _, cache = setup
    last = cache.decompose_resid(pos_slice=-1)  # [component, batch, d_model]
    with pytest.raises(InputError, match=r"tokens of shape \(2, 6\) do not fit the stack \(\d+, 2, 32\)"):
        cache.logit_attrs(last, tokens, pos_slice=-1)
    assert cache.logit_attrs(last, CORRECT, pos_slice=-1).shape == (last.shape[0], 2)
    assert cache.logit_attrs(last, 4, pos_slice=-1).shape == (last.shape[0], 2)
    full = cache.decompose_resid()  # one token per sequence, for every position (as TransformerLens)
    assert cache.logit_attrs(full, CORRECT).shape == (full.shape[0], 2, 6)
