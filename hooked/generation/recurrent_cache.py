"""The generation cache of a recurrent layer: its convolution window and its recurrent state.

An attention layer caches the keys and values of every position; a recurrent layer (Mamba, Mamba-2,
gated DeltaNet, LFM2's short convolution) needs only what carries on to the next position: the last
`ssm_conv_kernel - 1` inputs of its causal convolution and its state after the last position. Both
have a fixed size, whatever the length. `HookedTransformerKeyValueCache` holds one of these entries
per recurrent layer, beside the key/value entries of the attention layers.

The state is readable and writable: **state patching** is KV patching for recurrent layers. Run
prompt A with a cache, copy (or edit) `cache[layer].ssm_state`, and continue prompt B from it:

    cache_a = HookedTransformerKeyValueCache.init_cache(model.cfg, batch_size=1)
    model(prompt_a, past_kv_cache=cache_a)          # cache_a[l].ssm_state: the state after A
    model(suffix_b, past_kv_cache=cache_a)           # B's suffix continues from A's states
"""

from __future__ import annotations

import copy

import torch


class RecurrentStateEntry:
    """One recurrent layer's cache: `conv_state` and `ssm_state`, None until the first forward writes them.

    Attributes:
        conv_state: `[batch, ssm_conv_kernel - 1, conv_channels]`, the convolution's last inputs.
        ssm_state: the state after the last cached position: Mamba `[batch, d_inner, d_state]`, Mamba-2
            `[batch, head, d_head, d_state]`, gated DeltaNet `[batch, value_head, d_key_head, d_value_head]`
            (float32); None for LFM2's short convolution, which has no state besides its window.
        frozen: read but never written (a frozen cache serves one prefix to many continuations).
    """

    def __init__(self, frozen: bool = False):
        self.conv_state: torch.Tensor | None = None
        self.ssm_state: torch.Tensor | None = None
        self.frozen = frozen

    def store(self, conv_state: torch.Tensor | None, ssm_state: torch.Tensor | None) -> None:
        """Keep the states after this forward (unless frozen): the next forward starts from them."""
        if self.frozen:
            return
        self.conv_state, self.ssm_state = conv_state, ssm_state

    def clone(self) -> RecurrentStateEntry:
        new = copy.copy(self)
        new.conv_state = None if self.conv_state is None else self.conv_state.clone()
        new.ssm_state = None if self.ssm_state is None else self.ssm_state.clone()
        return new

    def __repr__(self) -> str:
        shape = lambda t: None if t is None else tuple(t.shape)  # noqa: E731
        return f"RecurrentStateEntry(conv_state={shape(self.conv_state)}, ssm_state={shape(self.ssm_state)})"
