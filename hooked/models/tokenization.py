"""Text to tokens with per-call BOS and padding choices, never mutating the tokenizer.

BOS is handled at the id level: text is tokenized without the tokenizer's automatic
special tokens (special-token text in the prompt is still recognised), BOS is inserted
before each row's first token when wanted and not already there, and only then are
rows padded. So a row never starts with two BOS tokens.
"""

from __future__ import annotations

import copy

import torch
from jaxtyping import Int

from hooked.core.errors import TokenizerError


def prepare_tokenizer(tokenizer):
    """The tokenizer with missing special tokens filled as TransformerLens does (eos `<|endoftext|>`,
    pad and bos = eos), but only with tokens that exist in its vocabulary.

    The caller's tokenizer is never mutated: when something must be filled, a copy is
    filled and returned. A token that cannot be filled stays None, and whatever needs
    it raises `TokenizerError` (e.g. `prepend_bos=True` without a BOS token).
    """
    fills = {}
    eos = tokenizer.eos_token
    if eos is None and _in_vocab(tokenizer, "<|endoftext|>"):
        fills["eos_token"] = eos = "<|endoftext|>"
    if eos is not None and tokenizer.pad_token is None:
        fills["pad_token"] = eos
    if eos is not None and tokenizer.bos_token is None:
        fills["bos_token"] = eos
    if not fills:
        return tokenizer
    tokenizer = copy.deepcopy(tokenizer)
    for name, token in fills.items():
        setattr(tokenizer, name, token)
    return tokenizer


def _in_vocab(tokenizer, token: str) -> bool:
    return token in tokenizer.get_vocab()


def bos_token_id(tokenizer) -> int:
    """The tokenizer's BOS id; raises `TokenizerError` with the fix if it has none."""
    bos = tokenizer.bos_token_id
    if bos is None or (bos == tokenizer.unk_token_id and tokenizer.bos_token != tokenizer.unk_token):
        raise TokenizerError(
            f"prepend_bos=True, but the tokenizer has no BOS token (bos_token={tokenizer.bos_token!r}). "
            "Pass prepend_bos=False, load the model with default_prepend_bos=False, or give the tokenizer a "
            "bos_token from its vocabulary."
        )
    return bos


def tokenizer_prepends_bos(tokenizer) -> bool:
    return len(tokenizer.encode("")) > 0


def encode_rows(tokenizer, texts: list[str], prepend_bos: bool) -> list[list[int]]:
    """Token ids per text, with exactly one BOS at the start iff `prepend_bos`.

    Special-token text in the prompt (e.g. a literal BOS) is still parsed; the BOS the
    tokenizer would add itself is left to this function, so it is never doubled.
    """
    bos = bos_token_id(tokenizer) if prepend_bos else None
    rows = tokenizer(texts, add_special_tokens=False)["input_ids"]
    if bos is None:
        return [list(ids) for ids in rows]
    return [[bos] + list(ids) if not ids or ids[0] != bos else list(ids) for ids in rows]


def pad_rows(
    rows: list[list[int]], pad_id: int, padding_side: str, max_len: int | None = None
) -> tuple[Int[torch.Tensor, "batch pos"], Int[torch.Tensor, "batch pos"]]:
    """Stack rows into `(tokens, attention_mask)`, truncating each to its first `max_len` ids."""
    if padding_side not in ("left", "right"):
        raise ValueError(f"padding_side must be 'left' or 'right', got {padding_side!r}")
    if max_len is not None:
        rows = [r[:max_len] for r in rows]
    width = max((len(r) for r in rows), default=0)
    if pad_id is None:
        if any(len(r) != width for r in rows):
            raise TokenizerError(
                "these prompts have different lengths and need padding, but the tokenizer has no pad token "
                "(nor an EOS to pad with): set tokenizer.pad_token, or run the prompts one at a time"
            )
        pad_id = 0  # never used: no row is padded
    tokens = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        cols = slice(width - len(r), width) if padding_side == "left" else slice(0, len(r))
        tokens[i, cols] = torch.tensor(r, dtype=torch.long)
        mask[i, cols] = 1
    return tokens, mask
