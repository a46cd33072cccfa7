"""Pieces of the pipelined forward that need no process group: micro-batch slices and their states."""

from __future__ import annotations

import pytest
import torch

from hooked.components.forward_state import ForwardState
from hooked.core.errors import InputError
from hooked.scale.collectives import PipelineError
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


def test_errors_state_the_timeout_and_how_to_shorten_it(monkeypatch):
    from hooked.scale import collectives

    monkeypatch.setattr(collectives._Group, "timeout_s", 300.0)
    monkeypatch.setattr(collectives._Group, "default_timeout", True)
    hint = collectives.timeout_hint()
    assert hint.startswith("a rank waits timeout_s=300 s (the default) for the others before giving up")
    assert "for interactive work load with a short one, e.g. from_pretrained(..., pipeline=True, timeout_s=30)" in hint
    monkeypatch.setattr(collectives._Group, "timeout_s", 20.0)
    monkeypatch.setattr(collectives._Group, "default_timeout", False)
    assert "timeout_s=20 s for the others" in collectives.stopped_answering(RuntimeError("Connection closed by peer"))


def test_a_mismatch_names_every_side_and_the_rule():
    from hooked.scale.collectives import mismatch

    seen = [(7, "reading cache['blocks.25.hook_resid_post']"), (7, "in forward()")]
    error = mismatch(seen, rank=1)
    assert str(error) == (
        "rank 0 is reading cache['blocks.25.hook_resid_post'] (pipelined call #7) while rank 1 is in forward() "
        "(pipelined call #7); cache reads are collectives: call them on every rank in the same order"
    )
    assert error.secondary and not mismatch(seen, rank=0).secondary
    three = str(mismatch([(3, "in forward()"), (3, "in backward()"), (3, "in forward()")], rank=0))
    assert three.startswith("ranks 0, 2 are in forward() (pipelined call #3) while rank 1 is in backward()")
    assert "every rank must make the same pipelined calls" in three


def test_an_uncaught_secondary_error_prints_one_line(monkeypatch, caplog):
    import sys

    from hooked.scale import collectives

    seen = []
    monkeypatch.setattr(sys, "excepthook", lambda *args: seen.append(args[1]))
    collectives._install_excepthook()
    secondary = collectives.secondary("pipelined forward: rank 1 failed: ValueError: boom", [1])
    with caplog.at_level("ERROR"):
        sys.excepthook(PipelineError, secondary, None)
    assert caplog.messages == [
        "PipelineError: pipelined forward: rank 1 failed: ValueError: boom (the traceback is in rank 1's output)"
    ]
    assert seen == []  # no traceback printed for it
    primary = PipelineError("pipelined forward: rank 1 failed: ValueError: boom")
    sys.excepthook(PipelineError, primary, None)
    assert seen == [primary]  # the failing rank's error goes to the usual hook
