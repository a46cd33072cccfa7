"""Admission by cost (hooked/serve/costs.py): activation shapes measured at start predict every
other size, and a request over a budget is refused naming the limit and the estimate.

Whether the estimates bound the memory really used is measured on a served model in
tests/integration/test_serve_costs.py.
"""

from __future__ import annotations

import pytest
import torch

from hooked.core.errors import WireError
from hooked.serve import costs
from tests.tiny_models import tiny_hooked


@pytest.fixture(scope="module", params=["gpt2", "llama_gqa", "moe", "attn_only_shortformer"])
def model(request):
    return tiny_hooked(request.param).eval()


def test_probed_shapes_predict_another_size(model):
    sizes = costs.ActivationSizes.probe(model)
    with torch.inference_mode():
        logits, cache = model.run_with_cache(torch.zeros(3, 11, dtype=torch.long), return_cache_object=False)
    assert set(sizes.hooks) == set(cache)
    for name, act in cache.items():
        hook = sizes.hooks[name]
        if hook.axes is None:  # a shape that depends on the data (a MoE expert's tokens): bounded per token
            assert act.numel() * act.element_size() <= hook.nbytes(3, 11), name
        else:
            assert sizes.shape(name, 3, 11) == tuple(act.shape), name
    assert sizes.logits_bytes(3, 11) == logits.numel() * logits.element_size()
    assert sizes.all_bytes(3, 11) >= sum(t.numel() * t.element_size() for t in cache.values())


def test_only_moe_experts_have_data_dependent_shapes():
    irregular = [n for n, h in costs.ActivationSizes.probe(tiny_hooked("moe").eval()).hooks.items() if h.axes is None]
    assert irregular and all(".experts." in n for n in irregular), irregular


def test_costs_grow_with_the_request(model):
    sizes = costs.ActivationSizes.probe(model)
    small = costs.forward_cost(sizes, 1, 8, [], [], True)
    assert costs.forward_cost(sizes, 1, 64, [], [], True).peak_bytes > small.peak_bytes
    assert costs.forward_cost(sizes, 4, 8, [], [], True).peak_bytes > small.peak_bytes
    cached = costs.forward_cost(sizes, 1, 8, list(sizes.hooks), [], True)
    assert cached.answer_bytes == sizes.all_bytes(1, 8) + sizes.logits_bytes(1, 8)
    ig = [costs.attribution_cost(sizes, 1, 8, ["blocks.0.hook_resid_pre"], "ig", 32, k, 1) for k in (1, 8, 32)]
    assert ig[0].peak_bytes < ig[1].peak_bytes < ig[2].peak_bytes
    assert ig[0].forwards > ig[2].forwards


def test_admit_names_the_limit_and_the_estimate():
    cost = costs.Cost(peak_bytes=3 * 2**30, answer_bytes=10, forwards=1)
    with pytest.raises(WireError, match=r"needs 3\.0 GiB .* limit is 1\.0 GiB .*--max-request-memory.*: do less") as e:
        costs.admit(cost, costs.Budget(2**30, 2**30), ": do less")
    assert e.value.status == 413
    with pytest.raises(WireError, match=r"answer would be 2\.0 KiB.*--max-answer-bytes"):
        costs.admit(costs.Cost(1, 2048, 1), costs.Budget(2**30, 1024))
    costs.admit(cost, costs.Budget(4 * 2**30, 2**30))  # within both
