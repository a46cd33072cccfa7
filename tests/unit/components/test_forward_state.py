"""ForwardState.to: a block on another device gets the call's masks and positions there, once per device."""

from __future__ import annotations

import torch

from hooked.components.forward_state import ForwardState


def test_to_the_same_device_is_the_state_itself():
    state = ForwardState.for_input(2, 5, "cpu", attention_mask=torch.tensor([[0, 1, 1, 1, 1], [1, 1, 1, 1, 1]]))
    assert state.to("cpu") is state


def test_to_another_device_copies_tensors_once_and_shares_the_kv_cache():
    mask = torch.tensor([[0, 1, 1, 1, 1], [1, 1, 1, 1, 1]])
    state = ForwardState.for_input(2, 5, "cpu", attention_mask=mask)
    state.past_kv_cache = object()
    state.tokens = torch.arange(10).reshape(2, 5)
    moved = state.to("meta", non_blocking=True)
    assert moved is state.to(torch.device("meta"))  # memoised: one copy per call and device
    assert moved.positions.device.type == moved.attention_mask.device.type == moved.tokens.device.type == "meta"
    assert moved.past_kv_cache is state.past_kv_cache  # the KV cache is never moved by input hooks
    assert moved.positions.shape == state.positions.shape and moved.n_keys == state.n_keys
    state.allowed()
    assert ("allowed", None) not in moved._memo  # rotary tables and masks are rebuilt on each device
