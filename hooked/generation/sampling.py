"""Sampling the next token (docs/generation.md, "Sampling order"): small pure functions on float32
last-position logits `[batch, vocab]`.

In order: repetition penalty, greedy (argmax) or temperature, frequency penalty,
top-k / top-p filtering, then a draw from the categorical distribution.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int


def token_counts(
    tokens: Int[torch.Tensor, "batch pos"], mask: Int[torch.Tensor, "batch pos"] | None, d_vocab: int
) -> Float[torch.Tensor, "batch d_vocab"]:
    """How often each vocabulary id occurs among each row's real tokens (pads, mask 0, excluded)."""
    weights = torch.ones(tokens.shape, dtype=torch.float32, device=tokens.device) if mask is None else mask.float()
    counts = torch.zeros(tokens.shape[0], d_vocab, dtype=torch.float32, device=tokens.device)
    return counts.scatter_add_(1, tokens, weights)


def apply_repetition_penalty(
    logits: Float[torch.Tensor, "batch d_vocab"],
    tokens: Int[torch.Tensor, "batch pos"],
    penalty: float,
    mask: Int[torch.Tensor, "batch pos"] | None = None,
) -> Float[torch.Tensor, "batch d_vocab"]:
    """CTRL's repetition penalty: every id already in the row has its logit pushed towards "less likely".

    Positive logits are divided by `penalty`, negative ones multiplied, so a penalty > 1
    always lowers the probability of repeating (HF's `RepetitionPenaltyLogitsProcessor`,
    except that pad positions do not count).
    """
    if penalty == 1.0:
        return logits
    seen = token_counts(tokens, mask, logits.shape[-1]) > 0
    penalized = torch.where(logits > 0, logits / penalty, logits * penalty)
    return torch.where(seen, penalized, logits)


def apply_freq_penalty(
    logits: Float[torch.Tensor, "batch d_vocab"],
    tokens: Int[torch.Tensor, "batch pos"],
    freq_penalty: float,
    mask: Int[torch.Tensor, "batch pos"] | None = None,
) -> Float[torch.Tensor, "batch d_vocab"]:
    """TransformerLens's frequency penalty: subtract `freq_penalty` per earlier occurrence of each id."""
    if freq_penalty == 0.0:
        return logits
    return logits - freq_penalty * token_counts(tokens, mask, logits.shape[-1])


def top_k_filter(logits: Float[torch.Tensor, "batch d_vocab"], k: int) -> Float[torch.Tensor, "batch d_vocab"]:
    """Keep the `k` largest logits of each row (ties with the k-th included); the rest become -inf."""
    k = min(k, logits.shape[-1])
    kth_largest = logits.topk(k, dim=-1).values[:, -1:]  # [batch, 1]
    return logits.masked_fill(logits < kth_largest, float("-inf"))


def top_p_filter(logits: Float[torch.Tensor, "batch d_vocab"], p: float) -> Float[torch.Tensor, "batch d_vocab"]:
    """Nucleus filtering: keep the smallest most-likely-first set whose probability reaches `p`.

    A token is dropped iff the tokens ranked above it already reach `p`, so the top
    token always survives. `p = 1` keeps everything.
    """
    if p >= 1.0:
        return logits
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    mass_before = F.pad(sorted_logits.softmax(-1).cumsum(-1)[:, :-1], (1, 0))  # [batch, vocab]: mass ranked above
    drop_sorted = mass_before >= p
    drop = drop_sorted.scatter(-1, order, drop_sorted)  # back to vocabulary order
    return logits.masked_fill(drop, float("-inf"))


def sample_next_token(
    logits: Float[torch.Tensor, "batch d_vocab"],
    tokens: Int[torch.Tensor, "batch pos"] | None = None,
    mask: Int[torch.Tensor, "batch pos"] | None = None,
    *,
    do_sample: bool = True,
    top_k: int | None = None,
    top_p: float | None = None,
    temperature: float = 1.0,
    freq_penalty: float = 0.0,
    repetition_penalty: float = 1.0,
    generator: torch.Generator | None = None,
) -> Int[torch.Tensor, "batch"]:
    """One token per row, in the order of docs/generation.md ("Sampling order").

    1. repetition penalty over the row's real `tokens`; 2. greedy argmax if `do_sample`
    is False or `temperature` is 0; 3. divide by `temperature`; 4. frequency penalty;
    5. top-k (which wins over top-p) or top-p; 6. sample with `generator`.
    """
    logits = logits.float()
    if tokens is not None:
        logits = apply_repetition_penalty(logits, tokens, repetition_penalty, mask)
    if not do_sample or temperature == 0.0:
        return logits.argmax(dim=-1)
    logits = logits / temperature
    if tokens is not None:
        logits = apply_freq_penalty(logits, tokens, freq_penalty, mask)
    if top_k is not None:
        logits = top_k_filter(logits, top_k)
    elif top_p is not None:
        logits = top_p_filter(logits, top_p)
    return torch.multinomial(logits.softmax(dim=-1), 1, generator=generator).squeeze(-1)  # [batch]


def _check_sampling(top_k, top_p, temperature, repetition_penalty) -> None:
    """Kept for imports; `hooked.core.validation.check_generate_args` checks every generate argument."""
    from hooked.core.validation import check_generate_args

    check_generate_args(0, temperature, top_k, top_p, 0.0, repetition_penalty, None, None, 1)
