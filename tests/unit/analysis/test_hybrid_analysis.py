"""Analysis on state-space and hybrid models: what works on every layer type, and what refuses recurrent layers.

Residual decompositions, the logit lens, activation patching over layers and positions and attribution
patching work on every block; the attention-only helpers (per-head results, patterns, head detection,
weight views stacked over layers) work on a hybrid's attention layers and name the layer type otherwise.
"""

from __future__ import annotations

import pytest
import torch

from hooked.analysis.head_detector import detect_head
from hooked.analysis.patching import get_act_patch_attn_out, get_act_patch_resid_pre
from hooked.circuits import attribution_patch
from hooked.core.errors import LayerTypeError
from tests.helpers import max_abs
from tests.tiny_models import hooked_from, tiny_ssm, tokens

torch.set_num_threads(1)

ATOL = 1e-5


@pytest.fixture(scope="module", params=["qwen3_next_moe", "nemotron_h", "mamba2"])
def run(request):
    model = hooked_from(tiny_ssm(request.param))
    t = tokens(2, 10)
    with torch.no_grad():
        _, cache = model.run_with_cache(t)
    return model, t, cache


def test_decompose_resid_sums_to_the_residual_stream(run):
    model, _, cache = run
    n = model.cfg.n_layers
    stack, labels = cache.decompose_resid(return_labels=True)
    assert max_abs(stack.sum(0), cache["resid_post", n - 1]) <= ATOL
    expected = ["embed"] + [f"{layer}_{w}" for layer in range(n) for w in model.cfg.block_writes(layer)]
    assert labels == expected
    assert any(label.endswith("_mixer_out") for label in labels)


def test_accumulated_resid_and_the_logit_lens(run):
    model, t, cache = run
    _, labels = cache.accumulated_resid(incl_mid=True, return_labels=True)
    mids = [f"{layer}_mid" for layer in range(model.cfg.n_layers) if cache._has_mid(layer)]
    assert [label for label in labels if label.endswith("_mid")] == mids
    assert labels[-1] == "final_post"
    lens, lens_labels = cache.logit_lens(return_labels=True)
    assert lens.shape[0] == model.cfg.n_layers + 1 and lens_labels[-1] == "final_post"
    with torch.no_grad():
        assert max_abs(lens[-1], model(t)) <= ATOL  # the last component is the logits


def test_full_resid_decomposition_sums_to_the_residual_stream(run):
    model, _, cache = run
    stack, labels = cache.get_full_resid_decomposition(expand_neurons=False, return_labels=True)
    assert max_abs(stack.sum(0), cache["resid_post", -1]) <= 1e-4
    recurrent = [f"{layer}_mixer_out" for layer in model.cfg.recurrent_layers]
    assert [label for label in labels if label.endswith("_mixer_out")] == recurrent
    heads = {label.split("H")[0] for label in labels if label.startswith("L") and "H" in label}
    assert heads == {f"L{layer}" for layer in model.cfg.attention_layers}


def test_head_results_cover_the_attention_layers_and_sum_with_the_remainder(run):
    model, _, cache = run
    stack, labels = cache.stack_head_results(incl_remainder=True, return_labels=True)
    assert len(labels) == len(model.cfg.attention_layers) * model.cfg.n_heads + 1
    assert max_abs(stack.sum(0), cache["resid_post", -1]) <= ATOL


def test_attention_helpers_name_the_layer_type_of_a_recurrent_layer(run):
    model, t, cache = run
    layer = model.cfg.recurrent_layers[0]
    kind = {"mamba2": "Mamba-2", "gated_deltanet": "gated DeltaNet"}[model.cfg.mixer_types[layer]]
    for key in (("pattern", layer), ("attn_out", layer), ("z", layer)):
        with pytest.raises(LayerTypeError, match=kind):
            cache[key]
    with pytest.raises(LayerTypeError, match=kind):
        _ = model.W_Q
    with pytest.raises(LayerTypeError, match="detect_head needs attention"):
        detect_head(model, t[:1], "previous_token_head", heads=[(layer, 0)])
    scores = detect_head(model, t[:1], "previous_token_head")  # default: every head of the attention layers
    assert bool((scores[model.cfg.recurrent_layers] == -1).all())
    assert bool((scores[model.cfg.attention_layers] >= -1).all())


def test_activation_patching_over_layers_and_positions(run):
    model, t, cache = run
    corrupted = t.clone()
    corrupted[:, 3] = (corrupted[:, 3] + 1) % model.cfg.d_vocab
    metric = lambda logits: logits[:, -1, 5].mean()  # noqa: E731
    with torch.no_grad():
        result = get_act_patch_resid_pre(model, corrupted, cache, metric, verbose=False)
        clean, bad = metric(model(t)), metric(model(corrupted))
    assert result.shape == (model.cfg.n_layers, t.shape[1])
    # patching every layer's resid_pre at the corrupted position restores the clean run
    assert max_abs(result[0, 3], clean) <= ATOL and max_abs(result[:, :3], bad) <= ATOL
    if model.cfg.recurrent_layers and model.cfg.layer_types is not None:
        with pytest.raises(LayerTypeError):
            get_act_patch_attn_out(model, corrupted, cache, metric, verbose=False)


def test_attribution_patching_reaches_the_state(run):
    """AtP through `hook_ssm_state`: the state of the corrupted position carries the effect."""
    model, t, _ = run
    corrupted = t.clone()
    corrupted[:, 3] = (corrupted[:, 3] + 1) % model.cfg.d_vocab
    layer = next(layer for layer in model.cfg.recurrent_layers if model.cfg.mixer_types[layer] != "short_conv")
    name = f"blocks.{layer}.mixer.hook_ssm_state"
    scores = attribution_patch(model, t, corrupted, lambda logits: logits[:, -1, 5].mean(), [name])
    per_position = scores[name].flatten(2).sum(-1)  # [batch, pos]
    assert bool((per_position[:, :3] == 0).all())  # before the corrupted token the two runs' states are equal
    assert bool((per_position[:, 3:].abs() > 0).all())


def test_the_inspect_report_reads_every_layer_type(run):
    """`hooked inspect`'s attribution names each write by its sublayer; its top heads come from attention layers."""
    from hooked.analysis.inspection import direct_logit_attribution, top_heads

    model, t, cache = run
    with torch.no_grad():  # as `inspect_prompt` runs it
        labels = {label for label, _ in direct_logit_attribution(model, cache, t.shape[1] - 1, 5, k=100)}
    expected = {"embed"} | {
        f"{dict(attn_out='attn', mixer_out='mixer', mlp_out='mlp')[w]} {layer}"
        for layer in range(model.cfg.n_layers)
        for w in model.cfg.block_writes(layer)
    }
    assert labels == expected
    heads = top_heads(model, cache, t.shape[1] - 1, [str(i) for i in range(t.shape[1])])
    assert {int(label[1:].split("H")[0]) for label, _, _ in heads} <= set(model.cfg.attention_layers)
