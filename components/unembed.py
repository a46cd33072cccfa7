"""Unembedding: the residual stream to logits over the vocabulary."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from jaxtyping import Float

from hooked.core.config import HookedTransformerConfig
from hooked.core.hook_points import HookPoint


def vocab_projection(
    x: Float[torch.Tensor, "tokens d_model"], W_U: Float[torch.Tensor, "d_model d_vocab"], decode_step: bool = False
) -> Float[torch.Tensor, "tokens d_vocab"]:
    """`x @ W_U`, contiguous; for a decode step, computed in the orientation BLAS runs fastest for `W_U`'s layout.

    For a vocabulary-major `W_U` (`W_U.T` contiguous) MKL's kernel for a few rows of `x`
    against the long vocabulary axis is several times slower than the same product
    transposed, `(W_U.T @ x.T).T` (measured on SmolLM2's 49152 x 576: 45 vs 16 ms for 4
    rows, and no slower for 1 row). From ~16 rows on the plain product wins, since the
    transposed one must copy its `[d_vocab, tokens]` result (1 thread, 512 rows:
    431 vs 493 ms on 49152 x 576, 244 vs 291 ms on 32000 x 512).

    The two orientations round differently, so the transposed one is taken only for a decode step
    (`decode_step`: one position per sequence, as `generate` projects, `logits_to_keep=1`). Every other
    projection is the plain product, HF's `lm_head` orientation and a compiled forward's: the eager
    and compiled forwards then agree bit for bit, and the logits of the last positions
    (`logits_to_keep=k > 1`) are computed as in the full projection.
    """
    if torch.compiler.is_compiling():  # the compiler picks the kernel; a branch on the size would re-specialise
        return x @ W_U
    if decode_step and W_U.stride(0) == 1 and 1 < x.shape[0] < 16:
        return (W_U.T @ x.T).T.contiguous()  # [d_vocab, tokens] -> [tokens, d_vocab]
    return x @ W_U


class Unembed(nn.Module):
    """`logits = x @ W_U + b_U`, then the optional soft-cap `c * tanh(logits / c)`.

    `W_U` is stored vocabulary-major (`[d_vocab_out, d_model]` memory, like `W_E` and
    HF's `lm_head`), so with tied embeddings it is simply a transposed view of `embed.W_E`.
    `hook_out` is taken before the soft-cap.
    """

    def __init__(self, cfg: HookedTransformerConfig):
        super().__init__()
        self.soft_cap = cfg.output_logits_soft_cap
        self.W_U = nn.Parameter(torch.empty(cfg.d_vocab_out, cfg.d_model, dtype=cfg.dtype).T)  # [d_model, d_vocab_out]
        self.b_U = nn.Parameter(torch.zeros(cfg.d_vocab_out, dtype=cfg.dtype))
        self.hook_in = HookPoint()  # [batch, pos, d_model]
        self.hook_out = HookPoint()  # [batch, pos, d_vocab_out]

    def forward(
        self, x: Float[torch.Tensor, "*batch pos d_model"], logits_to_keep: int = 0
    ) -> Float[torch.Tensor, "*batch kept_pos d_vocab_out"]:
        """Logits of every position, or with `logits_to_keep=k` of the last k only.

        Earlier positions are skipped before the projection unless something observes
        `hook_out`: then hooks see every position, and the last k are kept after them.
        """
        x = self.hook_in(x)
        skip_early = logits_to_keep and not self.hook_out.observed
        if skip_early:
            x = x[:, -logits_to_keep:]  # [batch, logits_to_keep, d_model]
        flat = x.reshape(-1, x.shape[-1])  # [batch * pos, d_model]
        bias = self._bias_matters()  # a zero bias would cost a full extra pass over the output
        if bias and flat.dtype in (torch.float16, torch.bfloat16):  # HF's biased Linear: one addmm, one rounding
            flat_logits = F.linear(flat, self.W_U.T, self.b_U)  # [batch * pos, d_vocab_out]
        else:
            decode_step = x.shape[-2] == 1  # one position per sequence: `generate`'s steps, `logits_to_keep=1`
            flat_logits = vocab_projection(flat, self.W_U, decode_step)  # [batch * pos, d_vocab_out]
            if bias:
                flat_logits = flat_logits.add_(self.b_U)  # fresh tensor: in place is safe for autograd
        logits = self.hook_out(flat_logits.view(*x.shape[:-1], -1))  # [batch, pos, d_vocab_out]
        if logits_to_keep and not skip_early:
            logits = logits[:, -logits_to_keep:]  # [batch, logits_to_keep, d_vocab_out]
        if self.soft_cap > 0:
            logits = self.soft_cap * torch.tanh(logits / self.soft_cap)
        return logits

    def _bias_matters(self) -> bool:
        if torch.compiler.is_compiling():  # no host sync in a graph: adding a zero bias is exact
            return True
        return (self.b_U.requires_grad and torch.is_grad_enabled()) or bool(self.b_U.any())
