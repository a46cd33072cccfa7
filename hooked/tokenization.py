"""Text to tokens with per-call BOS and padding choices, never mutating the tokenizer.

BOS is handled at the id level: text is tokenized without the tokenizer's automatic
special tokens (special-token text in the prompt is still recognised), BOS is inserted
before each row's first token when wanted and not already there, and only then are
rows padded. So a row never starts with two BOS tokens.
"""

from __future__ import annotations

import torch
from jaxtyping import Int


def prepare_tokenizer(tokenizer):
    """Fill missing special tokens as TransformerLens does: eos `<|endoftext|>`, pad and bos = eos."""
    if tokenizer.eos_token is None:
        tokenizer.eos_token = "<|endoftext|>"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if tokenizer.bos_token is None:
        tokenizer.bos_token = tokenizer.eos_token
    return tokenizer


def tokenizer_prepends_bos(tokenizer) -> bool:
    return len(tokenizer.encode("")) > 0


def encode_rows(tokenizer, texts: list[str], prepend_bos: bool) -> list[list[int]]:
    """Token ids per text, with exactly one BOS at the start iff `prepend_bos`.

    Special-token text in the prompt (e.g. a literal BOS) is still parsed; the BOS the
    tokenizer would add itself is left to this function, so it is never doubled.
    """
    bos = tokenizer.bos_token_id
    rows = tokenizer(texts, add_special_tokens=False)["input_ids"]
    return [[bos] + list(ids) if prepend_bos and (not ids or ids[0] != bos) else list(ids) for ids in rows]


def pad_rows(
    rows: list[list[int]], pad_id: int, padding_side: str, max_len: int | None = None
) -> tuple[Int[torch.Tensor, "batch pos"], Int[torch.Tensor, "batch pos"]]:
    """Stack rows into `(tokens, attention_mask)`, truncating each to its first `max_len` ids."""
    if padding_side not in ("left", "right"):
        raise ValueError(f"padding_side must be 'left' or 'right', got {padding_side!r}")
    if max_len is not None:
        rows = [r[:max_len] for r in rows]
    width = max((len(r) for r in rows), default=0)
    tokens = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        cols = slice(width - len(r), width) if padding_side == "left" else slice(0, len(r))
        tokens[i, cols] = torch.tensor(r, dtype=torch.long)
        mask[i, cols] = 1
    return tokens, mask
