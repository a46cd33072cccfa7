"""Per-head and per-neuron results on post-norm models (Gemma 2/3 sandwich norms, OLMo-2 post norms).

Behind a post-sublayer norm a layer writes `norm(sum of heads)`, so the default results
are each head's (neuron's) share with the norm's cached scale frozen and its gain
applied: they must add up to `hook_attn_out` / `hook_mlp_out`, and a full decomposition
must give the logit difference exactly as on pre-norm models.
"""

from __future__ import annotations

import functools
import warnings

import pytest
import torch

from tests.tiny_models import hooked_from, tiny_gemma, tiny_hf

ATOL = 1e-5


def _olmo2():
    return tiny_hf("Olmo2", seed=3, num_key_value_heads=2)


MODELS = {
    "gemma2": lambda: tiny_gemma("gemma2_softcaps_window", seed=1, final_logit_softcapping=None),
    "gemma3": lambda: tiny_gemma("gemma3_mixed_rope", seed=2),
    "olmo2": _olmo2,
}


@functools.cache
def _run(name: str, processed: bool):
    from hooked import HookedTransformer

    hf = MODELS[name]()
    model = HookedTransformer.from_pretrained("processed", hf_model=hf) if processed else hooked_from(hf)
    tokens = torch.randint(3, 90, (2, 10), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits, cache = model.run_with_cache(tokens)
    return model, tokens, logits, cache


@pytest.fixture(params=[(name, processed) for name in MODELS for processed in (False, True)],
                ids=lambda p: f"{p[0]}-{'processed' if p[1] else 'raw'}")  # fmt: skip
def run(request):
    return _run(*request.param)


@pytest.fixture(params=list(MODELS))
def processed_run(request):
    """Folded models: `logit_attrs` assumes ln_final's gain is folded into W_U, as in TransformerLens."""
    return _run(request.param, True)


def _close(actual, expected, what):
    scale = expected.abs().max().item()
    torch.testing.assert_close(actual, expected, atol=ATOL * max(1.0, scale), rtol=0, msg=what)


def test_the_models_have_post_sublayer_norms_and_no_output_biases(run):
    from hooked.analysis.cache_analysis import has_post_sublayer_norms

    model, *_ = run
    assert has_post_sublayer_norms(model.cfg)
    for block in model.blocks:
        assert torch.count_nonzero(block.attn.b_O) == 0 and torch.count_nonzero(block.mlp.b_out) == 0


def test_heads_of_each_layer_sum_to_attn_out(run):
    model, _, _, cache = run
    L, H = model.cfg.n_layers, model.cfg.n_heads
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # frozen post-norm results are exact: nothing to warn about
        heads, labels = cache.stack_head_results(layer=L, return_labels=True)
    assert labels[:H] == [f"L0H{h}" for h in range(H)]
    for layer_i in range(L):
        _close(
            heads[layer_i * H : (layer_i + 1) * H].sum(0),
            cache["attn_out", layer_i],
            f"layer {layer_i} heads vs hook_attn_out",
        )


def test_raw_pre_norm_head_results_stay_available_and_do_not_sum(run):
    model, _, _, cache = run
    raw = cache.stack_head_results(layer=1, freeze_post_norm=False)  # [head, batch, pos, d_model]
    z, W_O = cache["z", 0], model.blocks[0].attn.W_O
    _close(raw, torch.einsum("bphd,hdm->hbpm", z, W_O), "raw results are z @ W_O")
    assert (raw.sum(0) - cache["attn_out", 0]).abs().max().item() > 1e-2  # why freezing is the default


def test_neurons_of_each_layer_sum_to_mlp_out(run):
    model, _, _, cache = run
    L, d_mlp = model.cfg.n_layers, model.cfg.d_mlp
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        neurons = cache.stack_neuron_results(layer=L)  # [layer * neuron, batch, pos, d_model]
    for layer_i in range(L):
        _close(
            neurons[layer_i * d_mlp : (layer_i + 1) * d_mlp].sum(0),
            cache["mlp_out", layer_i],
            f"layer {layer_i} neurons vs hook_mlp_out",
        )
        _close(
            cache.get_neuron_results(layer_i).sum(-2), cache["mlp_out", layer_i], f"get_neuron_results layer {layer_i}"
        )


def test_projected_and_ln_applied_neurons_equal_the_expanded_ones(run):
    model, _, _, cache = run
    direction = torch.randn(model.cfg.d_model, generator=torch.Generator().manual_seed(1))
    expanded = cache.stack_neuron_results(layer=-1, pos_slice=-1, apply_ln=True)  # [component, batch, d_model]
    projected = cache.stack_neuron_results(layer=-1, pos_slice=-1, apply_ln=True, project_output_onto=direction)
    _close(projected, expanded @ direction, "project_output_onto after the frozen post norm")
    one = cache.get_neuron_results(1, pos_slice=-1, project_output_onto=direction)  # [batch, neuron]
    _close(one, cache.get_neuron_results(1, pos_slice=-1) @ direction, "get_neuron_results projection")


def test_full_decomposition_sums_to_the_residual_stream(run):
    model, _, _, cache = run
    stack = cache.get_full_resid_decomposition(expand_neurons=True)
    _close(stack.sum(0), cache["resid_post", model.cfg.n_layers - 1], "heads + neurons + embed + bias")
    mid = cache.get_full_resid_decomposition(layer=1, mlp_input=True, expand_neurons=False)
    _close(mid.sum(0), cache["resid_mid", 1], "decomposition at layer 1's MLP input")


def test_logit_attrs_of_the_full_decomposition_give_the_logit_difference(processed_run):
    model, tokens, logits, cache = processed_run
    correct, wrong = torch.tensor([5, 7]), torch.tensor([9, 11])
    stack = cache.get_full_resid_decomposition(pos_slice=-1, expand_neurons=False)
    attrs = cache.logit_attrs(stack, correct, wrong, pos_slice=-1)  # [component, batch]
    rows = torch.arange(2)
    assert model.cfg.output_logits_soft_cap <= 0  # no final soft cap: logits are linear in the final stream
    b_U = model.b_U if model.b_U is not None else torch.zeros(model.cfg.d_vocab_out)
    diff = (logits[rows, -1, correct] - b_U[correct]) - (logits[rows, -1, wrong] - b_U[wrong])
    _close(attrs.sum(0), diff, "sum of logit attributions vs logit difference")
    heads = cache.stack_head_results(layer=-1, pos_slice=-1)
    head_attrs = cache.logit_attrs(heads, correct, wrong, pos_slice=-1)
    _close(head_attrs.sum(0), attrs[: heads.shape[0]].sum(0), "heads' attributions are the decomposition's")


def test_missing_post_norm_scale_names_the_hook():
    from hooked import HookedTransformer
    from hooked.core.errors import MissingHooksError

    model = HookedTransformer.from_pretrained("processed", hf_model=_olmo2())
    tokens = torch.randint(3, 90, (1, 6), generator=torch.Generator().manual_seed(0))
    _, cache = model.run_with_cache(
        tokens, names_filter=lambda n: n.endswith(("hook_z", "hook_embed", "hook_resid_post"))
    )
    with pytest.raises(MissingHooksError, match=r"blocks\.0\.ln1\.hook_scale"):
        cache.stack_head_results(layer=1)
