"""Tiny random HF models of any family, with every parameter redrawn (shared by the parity tests)."""

from __future__ import annotations

import copy

import torch

VOCAB = 96


def tiny_hf(prefix: str, seed: int = 0, **overrides):
    """A random 2-layer `{prefix}ForCausalLM` (eager attention), d_model 32, 4 heads.

    As in the LLaMA parity tests: q/k projections (and MoE routers) N(0, 0.25²) so
    attention and routing are far from uniform, every other matrix and bias N(0, 0.1²),
    norm gains 1 + N(0, 0.2²). Special tokens are set inside the tiny vocabulary.
    """
    import transformers

    kwargs = dict(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        vocab_size=VOCAB,
        max_position_embeddings=64,
        num_attention_heads=4,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    kwargs.update(copy.deepcopy(overrides))  # HF fills defaults into rope dicts in place
    kwargs.setdefault("attn_implementation", "eager")
    torch.manual_seed(seed)
    config = getattr(transformers, prefix + "Config")(**kwargs)
    hf = getattr(transformers, prefix + "ForCausalLM")(config).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if ("norm" in name or ".ln_" in name) and not name.endswith("bias"):
                p.copy_(1 + 0.2 * torch.randn_like(p))
            else:
                sharp = ("q_proj.weight", "k_proj.weight", "qkv_proj.weight", "query_key_value.weight", "gate.weight")
                sharp = name.endswith(sharp)
                p.normal_(0.0, 0.25 if sharp else 0.1)
    return hf


def tokens(batch=2, pos=12, seed=0):
    return torch.randint(0, VOCAB, (batch, pos), generator=torch.Generator().manual_seed(seed))


def max_abs(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()
