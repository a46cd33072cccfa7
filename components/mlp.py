"""Feed-forward layers: dense (`act(x W_in + b_in) W_out`) and gated (SwiGLU / GeGLU)."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from jaxtyping import Float

from hooked.components.activations import get_activation
from hooked.components.norms import LayerNorm, LayerNormPre
from hooked.components.xielu import XIELU
from hooked.core.config import HookedTransformerConfig
from hooked.core.hook_points import HookPoint
from hooked.core.validation import require_set


def linear(
    x: Float[torch.Tensor, "... d_in"], W: Float[torch.Tensor, "d_in d_out"], b, bias_after: bool = False
) -> torch.Tensor:
    """`x @ W + b` as one fused matmul over all leading axes (`addmm(b, x, W)`, as HF's Linear).

    `bias_after` (Falcon's `FalconLinear`): the product, then the bias added, as two ops.
    """
    if bias_after:
        return torch.matmul(x, W) + b
    return F.linear(x, W.t(), b)


class MLP(nn.Module):
    """Dense MLP: `hook_pre = x W_in + b_in`, `hook_post = act(pre)`, out `post W_out + b_out`."""

    def __init__(self, cfg: HookedTransformerConfig | dict):
        super().__init__()
        cfg = HookedTransformerConfig.unwrap(cfg)
        d, dm, dt = cfg.d_model, require_set(cfg.d_mlp, "d_mlp"), cfg.dtype
        self.W_in = nn.Parameter(torch.empty(d, dm, dtype=dt))
        self.b_in = nn.Parameter(torch.zeros(dm, dtype=dt))
        self.W_out = nn.Parameter(torch.empty(dm, d, dtype=dt))
        self.b_out = nn.Parameter(torch.zeros(d, dtype=dt))
        # xIELU (Apertus) is trainable: a module, so its parameters are `mlp.act_fn.*`
        act_fn = require_set(cfg.act_fn, "act_fn")
        self.act_fn = XIELU(dtype=dt) if act_fn == "xielu" else get_activation(act_fn)
        self.hook_pre = HookPoint()  # [batch, pos, d_mlp]
        self.hook_post = HookPoint()  # [batch, pos, d_mlp]
        self.bias_after = cfg.bias_after_matmul
        if cfg.act_fn == "solu_ln":
            self.hook_mid = HookPoint()  # [batch, pos, d_mlp]
            folded = cfg.normalization_type in ("LNPre", "RMSPre")  # fold_ln folds mlp.ln too
            self.ln = (LayerNormPre if folded else LayerNorm)(cfg, dm)

    def activate(self, x: Float[torch.Tensor, "batch pos d_model"]) -> Float[torch.Tensor, "batch pos d_mlp"]:
        pre = self.hook_pre(linear(x, self.W_in, self.b_in, self.bias_after))
        if hasattr(self, "ln"):  # solu_ln: normalize the SoLU output
            return self.ln(self.hook_mid(self.act_fn(pre)))
        return self.act_fn(pre)

    def forward(self, x: Float[torch.Tensor, "batch pos d_model"]) -> Float[torch.Tensor, "batch pos d_model"]:
        post = self.hook_post(self.activate(x))  # [batch, pos, d_mlp]
        return linear(post, self.W_out, self.b_out, self.bias_after)


class GatedMLP(MLP):
    """Gated MLP: `post = act(x W_gate + b_gate) * (x W_in + b_in)`, as in HF's LLaMA.

    `hook_pre` is the gate before the activation and `hook_pre_linear` the linear branch.
    """

    def __init__(self, cfg: HookedTransformerConfig | dict):
        cfg = HookedTransformerConfig.unwrap(cfg)
        super().__init__(cfg)
        d_mlp = require_set(cfg.d_mlp, "d_mlp")
        self.W_gate = nn.Parameter(torch.empty(cfg.d_model, d_mlp, dtype=cfg.dtype))
        self.b_gate = nn.Parameter(torch.zeros(d_mlp, dtype=cfg.dtype))
        self.hook_pre_linear = HookPoint()  # [batch, pos, d_mlp]

    def activate(self, x: Float[torch.Tensor, "batch pos d_model"]) -> Float[torch.Tensor, "batch pos d_mlp"]:
        gate = self.hook_pre(linear(x, self.W_gate, self.b_gate, self.bias_after))
        return self.act_fn(gate) * self.hook_pre_linear(linear(x, self.W_in, self.b_in, self.bias_after))
