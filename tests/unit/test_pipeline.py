"""Pieces of the pipelined forward that need no process group: micro-batch slices and their states."""

from __future__ import annotations

import pytest
import torch

from hooked.components.forward_state import ForwardState
from hooked.errors import InputError
from hooked.scale.pipeline import _micro_slices, _slice_state


@pytest.mark.parametrize("batch,n_micro", [(8, 4), (7, 3), (5, 5), (9, 1)])
def test_micro_slices_cover_the_batch_in_order_and_balanced(batch, n_micro):
    slices = _micro_slices(batch, n_micro)
    rows = [r for sl in slices for r in range(batch)[sl]]
    assert rows == list(range(batch)) and len(slices) == n_micro
    sizes = [sl.stop - sl.start for sl in slices]
    assert max(sizes) - min(sizes) <= 1 and min(sizes) >= 1


def test_a_batch_smaller_than_the_micro_batch_count_is_refused():
    with pytest.raises(InputError, match="a batch of 2 cannot be cut into micro_batches=3"):
        _micro_slices(2, 3)
    with pytest.raises(InputError, match="micro_batches must be >= 1"):
        _micro_slices(4, 0)


def test_slice_state_keeps_the_rows_of_its_slice():
    mask = torch.tensor([[0, 1, 1], [1, 1, 1], [0, 0, 1], [1, 1, 1]])
    positions = (mask.cumsum(-1) - 1).clamp(min=0)  # [batch, pos]
    tokens = torch.arange(12).reshape(4, 3)
    state = ForwardState(mask, positions, 3, 3, True, 0, None, tokens)
    part = _slice_state(state, slice(1, 3))
    assert torch.equal(part.attention_mask, mask[1:3]) and torch.equal(part.positions, positions[1:3])
    assert torch.equal(part.tokens, tokens[1:3]) and (part.n_queries, part.n_keys, part.step) == (3, 3, 0)
    assert _slice_state(state, slice(0, 4)) is state
