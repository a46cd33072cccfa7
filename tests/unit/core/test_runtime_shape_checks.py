"""The runtime shape checks can fail: under HOOKED_TYPECHECK=1 a wrongly shaped tensor raises `TypeCheckError`.

`checked_only`: a plain `pytest` (no checks) deselects these tests and `make test` runs them in
its checked process; run on their own they need `HOOKED_TYPECHECK=1` (tests/README.md).
"""

from __future__ import annotations

import pytest
import torch
from jaxtyping import TypeCheckError

from hooked import HookedTransformerConfig
from hooked.components.mlp import MLP
from hooked.core.utils import lm_cross_entropy_loss

pytestmark = pytest.mark.checked_only


def test_the_library_is_checked():
    # the hook wraps every function of `hooked` (functools.wraps sets `__wrapped__`); without it
    # the tests below would pass or fail for the wrong reason
    assert hasattr(lm_cross_entropy_loss, "__wrapped__"), (
        "hooked was imported without the runtime shape checks: run this file with HOOKED_TYPECHECK=1 (make test does)"
    )


def test_a_float_attention_mask_is_refused():
    logits, tokens = torch.randn(2, 6, 10), torch.randint(0, 10, (2, 6))
    lm_cross_entropy_loss(logits, tokens, torch.ones(2, 6, dtype=torch.long))  # the annotated call passes
    # unchecked, `.bool()` would accept the float mask: the `Int[...]` annotation refuses it
    with pytest.raises(TypeCheckError, match="attention_mask"):
        lm_cross_entropy_loss(logits, tokens, torch.ones(2, 6))


def test_a_mask_of_another_length_than_the_tokens_is_refused():
    logits, tokens = torch.randn(2, 6, 10), torch.randint(0, 10, (2, 6))
    with pytest.raises(TypeCheckError, match="attention_mask"):
        lm_cross_entropy_loss(logits, tokens, torch.ones(2, 7, dtype=torch.long))


def test_a_component_forward_refuses_a_missing_batch_axis():
    cfg = HookedTransformerConfig(n_layers=1, d_model=8, d_head=4, n_heads=2, d_mlp=16, n_ctx=8, act_fn="gelu")
    mlp = MLP(cfg)
    assert mlp(torch.randn(2, 5, 8)).shape == (2, 5, 8)
    # unchecked, the matmuls broadcast over any leading axes: `batch pos d_model` needs all three
    with pytest.raises(TypeCheckError, match="forward"):
        mlp(torch.randn(5, 8))
