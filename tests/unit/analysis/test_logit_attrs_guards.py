"""`logit_attrs` and `apply_ln_to_stack`: every stack TransformerLens takes, scaled once, never silently misaligned."""

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
    with pytest.raises(InputError, match=r"the stack \(\d+, 2, 32\) and ln_final's cached scale with pos_slice=None "
                       r"and batch_slice=None \(2, 6, 1\) do not broadcast .*pos_slice=-1"):  # fmt: skip
        cache.logit_attrs(stack[:, :, -1], tokens=CORRECT, incorrect_tokens=WRONG)
    with pytest.raises(InputError, match=r"stack \(\d+, 2, 6, 32\) and .*pos_slice=-1 .* \(2, 1\) do not"):
        cache.logit_attrs(stack, CORRECT, WRONG, pos_slice=-1)


def _tl_apply_ln(model, cache, stack, pos_slice=None, batch_slice=None):
    """TransformerLens 2.x's apply_ln_to_stack at the final layer: center (LayerNorm), divide by broadcasting."""
    if model.cfg.normalization_type in ("LN", "LNPre"):
        stack = stack - stack.mean(-1, keepdim=True)
    scale = cache["ln_final.hook_scale"]
    scale = scale[:, pos_slice] if isinstance(pos_slice, int) else scale
    return stack / (scale if batch_slice is None else scale[batch_slice])


def test_every_stack_that_broadcasts_is_scaled_as_transformer_lens_does(setup):
    """#42: TransformerLens divides by broadcasting, so course code passes stacks without a component axis."""
    model, _, _, cache = setup
    last = cache["resid_post", -1][:, -1]  # [batch, d_model]: ARENA's IOI exercise
    heads = cache.stack_head_results(layer=-1, pos_slice=-1)  # [layer * head, batch, d_model]
    by_layer = heads.reshape(model.cfg.n_layers, -1, *heads.shape[1:])  # [layer, head, batch, d_model]
    whole = cache["resid_post", -1][None]  # [1, batch, pos, d_model]
    for stack, pos in [(last, -1), (heads, -1), (by_layer, -1), (whole, None)]:
        torch.testing.assert_close(
            cache.apply_ln_to_stack(stack, -1, pos_slice=pos), _tl_apply_ln(model, cache, stack, pos), rtol=0, atol=0
        )
    # one sequence's stack with batch_slice, and a stack without a batch axis
    torch.testing.assert_close(
        cache.apply_ln_to_stack(heads, -1, pos_slice=-1, batch_slice=1), _tl_apply_ln(model, cache, heads[:, 1], -1, 1)
    )
    one = cache["resid_post", -1][1]  # [pos, d_model]
    got = cache.apply_ln_to_stack(one[None], -1, batch_slice=1, has_batch_dim=False)
    torch.testing.assert_close(got, _tl_apply_ln(model, cache, one[None], None, 1))


def test_a_stack_the_scale_enlarges_gets_transformer_lens_result_with_a_warning(setup):
    model, _, _, cache = setup
    stack = cache.stack_head_results(layer=-1)  # [head, batch=2, pos=6, d_model]
    with pytest.warns(UserWarning, match=r"broadcasts the stack \(\d+, 1, 6, 32\) up to \(\d+, 2, 6, 32\)"):
        got = cache.apply_ln_to_stack(stack[:, :1], -1)
    torch.testing.assert_close(got, _tl_apply_ln(model, cache, stack[:, :1]), rtol=0, atol=0)


def test_logit_attrs_takes_the_course_stacks(setup):
    """`[batch, d_model]`, `[components, batch, d_model]` and `[layer, head, batch, d_model]` stacks with one
    token per sequence: the logit difference TransformerLens computes (its formula, with our gain rule)."""
    model, _, _, cache = setup
    directions = model.tokens_to_residual_directions(CORRECT) - model.tokens_to_residual_directions(WRONG)
    gain = getattr(model.ln_final, "w", None)
    directions = directions if gain is None else directions * gain
    last = cache["resid_post", -1][:, -1]  # [batch, d_model]
    heads = cache.stack_head_results(layer=-1, pos_slice=-1)
    by_layer = heads.reshape(model.cfg.n_layers, -1, *heads.shape[1:])
    for stack in (last, heads, by_layer):
        want = (_tl_apply_ln(model, cache, stack, -1) * directions).sum(-1)
        torch.testing.assert_close(cache.logit_attrs(stack, CORRECT, WRONG, pos_slice=-1), want, rtol=0, atol=0)


def test_tokens_that_would_broadcast_the_stack_are_refused(setup):
    _, tokens, _, cache = setup
    last = cache.decompose_resid(pos_slice=-1)  # [component, batch, d_model]
    with pytest.raises(InputError, match=r"stack \(\d+, 2, 32\) and the tokens' .* \(2, 6, 32\) do not"):
        cache.logit_attrs(last, tokens, pos_slice=-1)
    assert cache.logit_attrs(last, CORRECT, pos_slice=-1).shape == (last.shape[0], 2)
    assert cache.logit_attrs(last, 4, pos_slice=-1).shape == (last.shape[0], 2)
    full = cache.decompose_resid()  # one token per sequence, for every position (as TransformerLens)
    assert cache.logit_attrs(full, CORRECT).shape == (full.shape[0], 2, 6)
