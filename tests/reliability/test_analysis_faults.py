"""Patching, cache analysis and FactoredMatrix faults: mismatches raise instead of giving wrong shapes."""

from __future__ import annotations

import pytest
import torch

from hooked import FactoredMatrix
from hooked.analysis import patching
from hooked.core.errors import (
    InputError,
    InputTypeError,
    MissingHooksError,
    PatchingError,
    ShapeMismatchError,
    TokenError,
)

CLEAN = torch.tensor([[3, 17, 42, 7, 9]])  # [batch, pos]
CORRUPTED = torch.tensor([[3, 18, 42, 8, 9]])


def logit_diff(logits):
    return logits[0, -1, 5] - logits[0, -1, 6]


@pytest.fixture(scope="module")
def clean_cache(model):
    return model.run_with_cache(CLEAN)[1]


def test_patching_with_a_different_length(model, clean_cache, unchanged):
    with unchanged(model), pytest.raises(PatchingError, match="clean run has 5 positions .* corrupted_tokens has 4"):
        patching.get_act_patch_resid_pre(model, CORRUPTED[:, :4], clean_cache, logit_diff)


def test_patching_with_a_different_batch(model, clean_cache, unchanged):
    corrupted = torch.cat([CORRUPTED, CORRUPTED, CORRUPTED])
    _, two = model.run_with_cache(torch.cat([CLEAN, CLEAN]))
    with unchanged(model), pytest.raises(PatchingError, match="batch size 2 .* corrupted_tokens has 3"):
        patching.get_act_patch_attn_out(model, corrupted, two, logit_diff)


def test_pattern_patching_with_a_different_length(model, clean_cache, unchanged):
    with unchanged(model), pytest.raises(PatchingError, match="5 positions"):
        patching.get_act_patch_attn_head_pattern_all_pos(model, CORRUPTED[:, :3], clean_cache, logit_diff)


@pytest.mark.parametrize(
    "metric, match",
    [
        (lambda logits: logits[0, -1, :3], r"must return a scalar .* got a tensor of shape \(3,\)"),
        (lambda logits: None, r"got None"),
        (lambda logits: "high", r"got 'high'"),
    ],
    ids=["vector", "none", "str"],
)
def test_non_scalar_metric(model, clean_cache, unchanged, metric, match):
    with unchanged(model), pytest.raises(PatchingError, match=match):
        patching.get_act_patch_resid_pre(model, CORRUPTED, clean_cache, metric)


def test_clean_cache_without_the_activation(model, unchanged):
    _, partial = model.run_with_cache(CLEAN, names_filter="hook_embed")
    with unchanged(model), pytest.raises(PatchingError, match="no 'blocks.0.hook_mlp_out'"):
        patching.get_act_patch_mlp_out(model, CORRUPTED, partial, logit_diff)


def test_patching_float_tokens(model, clean_cache, unchanged):
    with unchanged(model), pytest.raises(PatchingError, match="integer token ids"):
        patching.get_act_patch_resid_pre(model, CORRUPTED.float(), clean_cache, logit_diff)


# -- cache analysis ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "names_filter, call, missing",
    [
        (lambda n: n != "hook_embed", lambda c: c.decompose_resid(), "hook_embed"),
        (lambda n: n != "hook_pos_embed", lambda c: c.decompose_resid(), "hook_pos_embed"),
        (lambda n: "mlp_out" not in n, lambda c: c.decompose_resid(), "blocks.0.hook_mlp_out"),
        (lambda n: n != "blocks.1.hook_resid_pre", lambda c: c.accumulated_resid(), "blocks.1.hook_resid_pre"),
        (lambda n: n != "hook_pos_embed", lambda c: c.get_full_resid_decomposition(), "hook_pos_embed"),
        (lambda n: "resid_mid" not in n, lambda c: c.accumulated_resid(incl_mid=True), "blocks.0.hook_resid_mid"),
        (lambda n: "resid_post" not in n, lambda c: c.logit_lens(), "blocks.1.hook_resid_post"),
    ],
    ids=["decompose-embed", "decompose-pos-embed", "decompose-mlp-out", "accumulated-resid-pre",
         "full-decomposition-pos-embed", "accumulated-mid", "logit-lens-post"],
)  # fmt: skip
def test_analysis_on_a_cache_missing_hooks(model, unchanged, names_filter, call, missing):
    _, cache = model.run_with_cache(CLEAN, names_filter=names_filter)
    with unchanged(model), pytest.raises(MissingHooksError, match=rf"needs .*{missing}.*names_filter=") as info:
        call(cache)
    assert isinstance(info.value, KeyError) and "names_filter" in str(info.value)


def test_missing_cache_key(model, clean_cache):
    with pytest.raises(MissingHooksError, match="'blocks.0.attn.hook_result'"):
        clean_cache["result", 0]


# -- FactoredMatrix -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: FactoredMatrix(torch.ones(4, 3), torch.ones(2, 5)), r"inner dimensions differ: A\(4, 3\) @ B\(2, 5\)"),
        (lambda: FactoredMatrix(torch.ones(3), torch.ones(3, 5)), r"at least 2-D, got A\(3,\)"),
        (lambda: FactoredMatrix(torch.ones(2, 4, 3), torch.ones(3, 3, 5)), "leading dimensions do not broadcast"),
        (lambda: FactoredMatrix(torch.ones(4, 3), torch.ones(3, 5)) @ torch.ones(4, 2), r"shape \(4, 2\).*must be 5"),
        (lambda: FactoredMatrix(torch.ones(4, 3), torch.ones(3, 5)) @ torch.ones(7), r"shape \(7,\).*must be 5"),
        (lambda: torch.ones(2, 5) @ FactoredMatrix(torch.ones(4, 3), torch.ones(3, 5)), r"shape \(2, 5\).*must be 4"),
        (lambda: FactoredMatrix(torch.ones(4, 3), torch.ones(3, 5)).BA, r"BA needs a square matrix, shape is \(4, 5\)"),
        (
            lambda: (
                FactoredMatrix(torch.ones(4, 3), torch.ones(3, 5)) @ FactoredMatrix(torch.ones(4, 2), torch.ones(2, 2))
            ),
            r"shape \(4, 2\)",
        ),
    ],
    ids=["inner", "1d-factor", "leading", "matmul", "matmul-vector", "rmatmul", "BA", "fm@fm"],
)
def test_factored_matrix_mismatches(make, match):
    with pytest.raises(ShapeMismatchError, match=match) as info:
        make()
    assert isinstance(info.value, (ValueError, AssertionError))


def test_factored_matrix_scalar_only(model):
    with pytest.raises(ValueError, match=r"\* needs a scalar, got a tensor of shape \(3,\)"):
        model.blocks[0].attn.OV * torch.ones(3)


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda c: c.decompose_resid(layer=99), r"layer=99 is out of range: .* allow 0 to 2"),
        (lambda c: c.accumulated_resid(layer=-5), r"layer=-5 is out of range"),
        (lambda c: c.stack_head_results(layer=3), r"layer=3 is out of range"),
        (lambda c: c.accumulated_resid(layer=1.0), r"layer must be an int or None, got float"),
    ],
    ids=["decompose-99", "accumulated--5", "heads-3", "float"],
)
def test_analysis_layer_out_of_range(model, clean_cache, unchanged, call, match):
    with unchanged(model), pytest.raises((InputError, InputTypeError), match=match):
        call(clean_cache)


def test_logit_attrs_with_an_out_of_range_token(model, clean_cache, unchanged):
    with unchanged(model), pytest.raises(TokenError, match="token id 1000000"):
        clean_cache.logit_attrs(clean_cache.decompose_resid(), tokens=10**6)
