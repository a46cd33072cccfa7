"""Tiny random models of several families and clean/corrupted token pairs for the circuit tests."""

from __future__ import annotations

import torch

from hooked import HookedTransformer, HookedTransformerConfig

BASE = dict(d_model=32, d_head=8, n_layers=2, n_ctx=16, d_vocab=50, d_mlp=48, seed=0)
ROTARY = dict(normalization_type="RMS", positional_embedding_type="rotary", act_fn="silu", gated_mlp=True)
FAMILIES = {
    "gpt2": dict(act_fn="gelu"),
    "llama_gqa": dict(ROTARY, n_key_value_heads=2),
    "moe": dict(ROTARY, num_experts=4, experts_per_token=2),
    "neox_parallel": dict(act_fn="gelu", parallel_attn_mlp=True, positional_embedding_type="rotary"),
    "gemma_post_norm": dict(ROTARY, use_normalization_before_and_after=True, n_key_value_heads=1),
    "olmo2_post_norm": dict(ROTARY, post_sublayer_norm=True),
    "attn_only_shortformer": dict(attn_only=True, positional_embedding_type="shortformer"),
}


def make_model(family: str, **overrides) -> HookedTransformer:
    return HookedTransformer(HookedTransformerConfig(**{**BASE, **FAMILIES[family], **overrides}))


def token_pair(batch: int = 3, pos: int = 6, seed: int = 0, positions=(2,)) -> tuple[torch.Tensor, torch.Tensor]:
    """Random clean tokens and a corrupted copy differing at `positions`."""
    gen = torch.Generator().manual_seed(seed)
    clean = torch.randint(0, BASE["d_vocab"], (batch, pos), generator=gen)
    corrupted = clean.clone()
    for p in positions:
        corrupted[:, p] = torch.randint(0, BASE["d_vocab"], (batch,), generator=gen)
    return clean, corrupted


def logit_diff(logits: torch.Tensor) -> torch.Tensor:
    """A metric linear in the logits: last-position logit 3 minus logit 7, batch mean."""
    return (logits[:, -1, 3] - logits[:, -1, 7]).mean()


def right_padding_mask(batch: int, pos: int) -> torch.Tensor:
    """Each row one shorter than the last (row 0 full): `[batch, pos]` of 1s then 0s."""
    lengths = torch.tensor([pos - i for i in range(batch)])
    return (torch.arange(pos)[None] < lengths[:, None]).long()


def last_token_metric(mask: torch.Tensor):
    """Logit 3 minus logit 7 at each row's last real token (for right-padded batches)."""
    last = mask.sum(1) - 1

    def metric(logits: torch.Tensor) -> torch.Tensor:
        rows = logits[torch.arange(logits.shape[0]), last]  # [batch, d_vocab]
        return (rows[:, 3] - rows[:, 7]).mean()

    return metric
