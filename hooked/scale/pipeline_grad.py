"""Gradients across pipeline stages: two autograd functions that carry the residual's gradient back.

Forward, stage r receives its input from r-1 and sends its output to r+1. Backward runs
the other way: `loss.backward()` on the last rank reaches the tensor it received, whose
`SendGradBack` node sends the gradient to r-1; on r-1 the returned (broadcast) result is
tied to its stage output by `RecvGradFromNext`, whose backward receives that gradient and
continues into r-1's blocks. Every rank calls `backward()` on the same function of the
same result (SPMD), so each rank's own backward hooks fire with single-process values.
"""

from __future__ import annotations

import torch

from hooked.scale.collectives import PipelineError, recv_tensor, send_tensor


class SendGradBack(torch.autograd.Function):
    """Identity forward; backward sends the gradient to the previous stage."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, prev_rank: int, device: torch.device) -> torch.Tensor:
        ctx.prev_rank, ctx.device = prev_rank, device
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        send_tensor(grad, ctx.prev_rank, ctx.device)  # [batch, pos, d_model]
        return grad, None, None


class RecvGradFromNext(torch.autograd.Function):
    """Forward returns the shared `result`; backward feeds the next stage's gradient into `stage_out`."""

    @staticmethod
    def forward(ctx, result: torch.Tensor, stage_out: torch.Tensor, next_rank: int, device: torch.device):
        ctx.next_rank, ctx.device, ctx.dtype = next_rank, device, stage_out.dtype
        return result.clone()

    @staticmethod
    def backward(ctx, grad_result: torch.Tensor):
        grad = recv_tensor(ctx.next_rank, ctx.dtype, ctx.device)  # [batch, pos, d_model]
        if grad is None:
            raise PipelineError(f"rank {ctx.next_rank} sent no gradient")
        return None, grad, None, None
