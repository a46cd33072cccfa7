"""A `hooked` state dict in the exact form TransformerLens 2.x loads with `strict=True`.

TransformerLens registers per-layer buffers that `hooked` does not need: the causal
`attn.mask` (`[n_ctx, n_ctx]` bool, banded for local attention), `attn.IGNORE` (-inf) and,
for rotary models, `attn.rotary_sin`/`attn.rotary_cos` (`[n_ctx, rotary_dim]`).
`HookedTransformer.load_state_dict` drops them again, so such a file loads into both.
The gated-MLP gate bias `mlp.b_gate` (always zero for converted HF models) is left out,
as TransformerLens has none.
"""

from __future__ import annotations

import torch

from hooked.components.rotary import rotary_cos_sin


def tl_state_dict(model) -> dict[str, torch.Tensor]:
    """`model.state_dict()` plus TransformerLens's attention buffers (tied `W_U` saved as its own tensor)."""
    cfg = model.cfg
    state = {k: v.detach().clone() if k == "unembed.W_U" else v for k, v in model.state_dict().items()}
    causal = torch.tril(torch.ones(cfg.n_ctx, cfg.n_ctx, dtype=torch.bool))  # [query_pos, key_pos]
    for key in [k for k in state if k.endswith("mlp.b_gate")]:  # TransformerLens's GatedMLP has no gate bias
        if state[key].any():
            raise ValueError(
                f"{key} is non-zero: TransformerLens's GatedMLP has no gate bias, so this model cannot be saved "
                "in its format (every converted HF model has a zero gate bias)"
            )
        del state[key]
    for layer, block in enumerate(model.blocks):
        attn, prefix = block.attn, f"blocks.{layer}.attn."
        window = getattr(attn, "window", None)
        state[prefix + "mask"] = causal if window is None else torch.triu(causal, 1 - window)
        state[prefix + "IGNORE"] = torch.tensor(-torch.inf)
        if getattr(attn, "rotary", False):
            positions = torch.arange(cfg.n_ctx)[None]  # [1, n_ctx]
            cos, sin = rotary_cos_sin(positions, attn.inv_freq.float(), cfg.rotary_adjacent_pairs, cfg.dtype)
            state[prefix + "rotary_sin"] = sin[0, :, 0]  # [n_ctx, rotary_dim]
            state[prefix + "rotary_cos"] = cos[0, :, 0]  # [n_ctx, rotary_dim]
    return state
