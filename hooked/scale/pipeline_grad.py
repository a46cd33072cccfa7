"""Gradients across pipeline stages: two autograd functions that carry the residual's gradient back.

Forward, stage r receives its input from r-1 and sends its output to r+1, one micro-batch
slice at a time. Backward runs the other way: `loss.backward()` on the last rank reaches
the slices it received, whose `SendGradBack` nodes hand their gradients to a `GradMailbox`
that sends them to r-1 in slice order once all have arrived (autograd visits the slices
in no fixed order); on r-1 the returned (broadcast) result is tied to every slice's stage
output by `RecvGradFromNext`, whose backward receives those gradients and continues into
r-1's blocks. Every rank calls `backward()` on the same function of the same result
(SPMD), so each rank's own backward hooks fire with single-process values.
"""

from __future__ import annotations

import torch

from hooked.scale.collectives import PipelineError, check_in, recv_tensor, send_tensor


class CheckInBackward(torch.autograd.Function):
    """Identity forward on a pipelined result; its backward checks in before any gradient crosses ranks.

    Every rank calls `backward()` on the same function of the same result, so this is the
    first node each rank's backward reaches: a rank calling `backward()` while another does
    something else fails at once, naming both.
    """

    @staticmethod
    def forward(ctx, result: torch.Tensor, device: torch.device) -> torch.Tensor:
        ctx.device = device
        return result.view_as(result)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        with check_in("in backward()", ctx.device):
            return grad, None


class GradMailbox:
    """The gradients of one forward's `n` received slices, sent to `prev_rank` in slice order when complete."""

    def __init__(self, n: int, prev_rank: int, device: torch.device):
        self.grads: list[torch.Tensor | None] = [None] * n
        self.prev_rank, self.device = prev_rank, device

    def put(self, index: int, grad: torch.Tensor) -> None:
        self.grads[index] = grad
        if all(g is not None for g in self.grads):
            for g in self.grads:
                send_tensor(g, self.prev_rank, self.device)  # [micro_batch, pos, d_model]
            self.grads = [None] * len(self.grads)


class SendGradBack(torch.autograd.Function):
    """Identity forward on received slice `index`; backward posts its gradient to the mailbox."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, mailbox: GradMailbox, index: int) -> torch.Tensor:
        ctx.mailbox, ctx.index = mailbox, index
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        ctx.mailbox.put(ctx.index, grad)
        return grad, None, None


class RecvGradFromNext(torch.autograd.Function):
    """Forward returns the shared `result`; backward feeds the next stage's gradients into each slice's output."""

    @staticmethod
    def forward(ctx, result: torch.Tensor, next_rank: int, device: torch.device, *stage_outs: torch.Tensor):
        ctx.next_rank, ctx.device = next_rank, device
        ctx.dtypes = [out.dtype for out in stage_outs]
        return result.clone()

    @staticmethod
    def backward(ctx, grad_result: torch.Tensor):
        grads = [recv_tensor(ctx.next_rank, dtype, ctx.device) for dtype in ctx.dtypes]  # [micro_batch, pos, d_model]
        if any(g is None for g in grads):
            raise PipelineError(f"rank {ctx.next_rank} sent no gradient")
        return (None, None, None, *grads)
