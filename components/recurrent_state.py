"""The state hook of a recurrent mixer: materialised only when observed, and an edit propagates as the recurrence says.

A recurrent mixer (Mamba, Mamba-2, gated DeltaNet) carries a state `h_t` from position to position,

    h_t = T_t(h_{t-1}) + u_t          (T_t linear: a decay, or DeltaNet's `exp(g) (I - beta k k^T)`)

and reads its output from it. Per position the state is large (`[batch, pos, heads, d_head, d_state]`), so
the fast path never builds it: it computes the outputs chunk by chunk. Only when a hook observes
`hook_ssm_state` is every position's state materialised and passed through the hook. Then:

- read-only hooks (caching) see the states and the outputs stay the fast path's, bit for bit;
- an edit `e_t = hooked_t - h_t` is injected at t and carried on by the recurrence: the state used at a
  later position s is `h_s + sum_{t <= s} T_{t->s}(e_t)`, exactly what re-running the recurrence from the
  edited state gives (one edit at t: the state at t is the hooked one, every later one follows from it);
- with a backward hook, or an editing hook under autograd (attribution patching captures the states to
  differentiate through them), the outputs are read from the hooked states in that form, so the gradient
  at `h_t` counts its effect on every later position.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from hooked.components.norms import unedited
from hooked.core.hook_points import HookPoint

States = torch.Tensor  # [batch, pos, *state]


def hooked_states(
    hook: HookPoint, materialise: Callable[[], States], propagate: Callable[[States], States]
) -> States | None:
    """The states the outputs must be read from, or None when the fast path's outputs stand.

    Args:
        hook: the mixer's `hook_ssm_state`.
        materialise: every position's state, `[batch, pos, *state]` (called only when observed).
        propagate: `e -> p` with `p_t = T_t(p_{t-1}) + e_t`: the recurrence without its input, run on edits.
    """
    if not hook.observed:
        return None
    states = materialise()  # [batch, pos, *state]
    if hook.is_read_only:  # caching hooks only: they cannot change anything
        hook(states)
        return None
    # under autograd a hook may differentiate through the states (attribution): read the outputs from them
    grad_path = hook.needs_grad_path or torch.is_grad_enabled()
    before = None if grad_path else states.clone()
    hooked = hook(states)
    if before is not None and unedited(states, before, hooked):
        return None
    edits = hooked - states  # [batch, pos, *state]: zero where the hook left the state alone
    return hooked + (propagate(edits) - edits)  # each edit's effect on the later positions added
