"""Activation sparsity (Gemma 3n): a Gaussian top-k that zeroes most of an MLP's gate before its activation.

Assuming a gate's values over `d_mlp` are roughly normal, the cutoff `mean + std * Phi^-1(s)` keeps
the top `1 - s` of them: `gate' = relu(gate - cutoff)` (mean and standard deviation per position,
`s` the layer's `cfg.activation_sparsity`, 0.95 on Gemma 3n's first 10 layers). Then, as in
`GatedMLP`, `post = act(gate') * (x W_in)`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from jaxtyping import Float

from hooked.components.mlp import GatedMLP, linear
from hooked.core.config import HookedTransformerConfig
from hooked.core.hook_points import HookPoint


class SparseGatedMLP(GatedMLP):
    """A `GatedMLP` whose gate goes through the Gaussian top-k first (`hook_pre` before, `hook_sparse_gate` after)."""

    def __init__(self, cfg: HookedTransformerConfig, sparsity: float):
        super().__init__(cfg)
        self.sparsity = sparsity
        self.hook_sparse_gate = HookPoint()  # [batch, pos, d_mlp]: relu(gate - cutoff)

    def activate(self, x: Float[torch.Tensor, "batch pos d_model"]) -> Float[torch.Tensor, "batch pos d_mlp"]:
        gate = self.hook_pre(linear(x, self.W_gate, self.b_gate, self.bias_after))  # [batch, pos, d_mlp]
        sparse = self.hook_sparse_gate(gaussian_top_k(gate, self.sparsity))
        return self.act_fn(sparse) * self.hook_pre_linear(linear(x, self.W_in, self.b_in, self.bias_after))


def gaussian_top_k(gate: Float[torch.Tensor, "... d_mlp"], sparsity: float) -> Float[torch.Tensor, "... d_mlp"]:
    """`relu(gate - (mean + std * Phi^-1(sparsity)))` over the last axis, in HF's order and dtypes."""
    target = torch.tensor(sparsity, dtype=torch.float32, device=gate.device)
    multiplier = torch.distributions.normal.Normal(0, 1).icdf(target).type(gate.dtype)
    mean = torch.mean(gate, dim=-1, keepdim=True)
    std = torch.std(gate, dim=-1, keepdim=True, unbiased=False)
    return F.relu(gate - (mean + std * multiplier))
