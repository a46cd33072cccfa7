"""Tokenizer helpers of `HookedTransformer` (`to_tokens`, `to_str_tokens`, ...).

`prepend_bos` and `padding_side` are resolved per call into local values; neither the
config nor the tokenizer is ever mutated by a call.
"""

from __future__ import annotations

import copy
from typing import Literal, overload

import numpy as np
import torch
from jaxtyping import Int

from hooked.components.forward_state import ForwardState
from hooked.core.config import HookedTransformerConfig
from hooked.core.errors import InputError
from hooked.core.utils import USE_DEFAULT_VALUE, token_index
from hooked.core.validation import check_text, check_token_range
from hooked.models.tokenization import encode_rows, pad_rows, prepare_tokenizer, tokenizer_prepends_bos


class TokenizerMixin:
    """Methods that need `self.tokenizer`, `self.cfg` and `self.default_padding_side`."""

    # set by the host class (`HookedTransformer`); declared here for the type checker
    cfg: HookedTransformerConfig
    forward_state: ForwardState | None

    def set_tokenizer(self, tokenizer, default_padding_side: str = "right") -> None:
        """Attach a HF tokenizer: fills missing special tokens and sets `d_vocab` if unknown."""
        self.tokenizer = prepare_tokenizer(tokenizer)
        if self.tokenizer is tokenizer and tokenizer.padding_side != default_padding_side:
            self.tokenizer = copy.deepcopy(tokenizer)  # the caller's tokenizer is never mutated
        self.default_padding_side = default_padding_side  # also the tokenizer's padding_side, as in TransformerLens
        self.cfg.tokenizer_prepends_bos = tokenizer_prepends_bos(self.tokenizer)
        if self.cfg.d_vocab == -1:
            self.cfg.d_vocab = max(self.tokenizer.get_vocab().values()) + 1
            if self.cfg.d_vocab_out == -1:
                self.cfg.d_vocab_out = self.cfg.d_vocab

    @property
    def default_padding_side(self) -> str:
        """Padding used when a call does not choose one: the tokenizer's `padding_side`, as in TransformerLens.

        So `model.tokenizer.padding_side = "left"` is honoured; a per-call `padding_side=`
        still wins and never mutates the tokenizer.
        """
        tokenizer = getattr(self, "tokenizer", None)
        return tokenizer.padding_side if tokenizer is not None else self.__dict__.get("_default_padding_side", "right")

    @default_padding_side.setter
    def default_padding_side(self, side: str) -> None:
        if side not in ("left", "right"):
            raise ValueError(f"padding_side must be 'left' or 'right', got {side!r}")
        self.__dict__["_default_padding_side"] = side
        if getattr(self, "tokenizer", None) is not None:
            self.tokenizer.padding_side = side

    def _need_tokenizer(self):
        if self.tokenizer is None:
            raise ValueError(
                "This model has no tokenizer: pass tokenizer= to HookedTransformer / from_pretrained, "
                "or call model.set_tokenizer(tokenizer)."
            )
        return self.tokenizer

    def _tokenization_options(self, prepend_bos, padding_side) -> tuple[bool, str]:
        bos = self.cfg.default_prepend_bos if prepend_bos is USE_DEFAULT_VALUE or prepend_bos is None else prepend_bos
        side = self.default_padding_side if padding_side is USE_DEFAULT_VALUE or padding_side is None else padding_side
        return bool(bos), side

    # (the overloads tell the type checker that only return_attention_mask=True returns a pair)
    @overload
    def to_tokens(
        self,
        input: str | list[str],
        prepend_bos=...,
        padding_side=...,
        move_to_device: bool = ...,
        truncate: bool = ...,
        *,
        return_attention_mask: Literal[False] = ...,
    ) -> torch.Tensor: ...
    @overload
    def to_tokens(
        self,
        input: str | list[str],
        prepend_bos=...,
        padding_side=...,
        move_to_device: bool = ...,
        truncate: bool = ...,
        *,
        return_attention_mask: Literal[True],
    ) -> tuple[torch.Tensor, torch.Tensor]: ...
    @overload
    def to_tokens(
        self,
        input: str | list[str],
        prepend_bos=...,
        padding_side=...,
        move_to_device: bool = ...,
        truncate: bool = ...,
        *,
        return_attention_mask: bool,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]: ...
    def to_tokens(
        self,
        input: str | list[str],
        prepend_bos=USE_DEFAULT_VALUE,
        padding_side=USE_DEFAULT_VALUE,
        move_to_device: bool = True,
        truncate: bool = True,
        *,
        return_attention_mask: bool = False,
    ) -> Int[torch.Tensor, "batch pos"] | tuple[Int[torch.Tensor, "batch pos"], Int[torch.Tensor, "batch pos"]]:
        """Tokenize text into `[batch, pos]` ids (and the mask with `return_attention_mask`).

        BOS is handled at the id level: it is added at most once, never doubled.

        Args:
            input: a string or a list of strings (padded to the longest).
            prepend_bos: add BOS (default: the model's `cfg.default_prepend_bos`); never mutates it.
            padding_side: "left" or "right" (default: the model's); never mutates the tokenizer.
            move_to_device: put the ids on the model's device.
            truncate: cut to `cfg.n_ctx` tokens.
            return_attention_mask: also return the `[batch, pos]` 0/1 mask of real tokens.

        Returns:
            Token ids `[batch, pos]`, or `(tokens, attention_mask)`.
        """
        tok = self._need_tokenizer()
        bos, side = self._tokenization_options(prepend_bos, padding_side)
        texts = check_text(input)
        rows = encode_rows(tok, texts, bos)
        tokens, mask = pad_rows(rows, tok.pad_token_id, side, self.cfg.n_ctx if truncate else None)
        if move_to_device:
            tokens, mask = tokens.to(self.cfg.device), mask.to(self.cfg.device)
        return (tokens, mask) if return_attention_mask else tokens

    def to_string(self, tokens) -> str | list[str]:
        """Decode ids: rank <= 1 gives a str, rank 2 a list of str."""
        tok = self._need_tokenizer()
        if isinstance(tokens, (list, np.ndarray)):
            tokens = torch.as_tensor(tokens)
        if isinstance(tokens, int):
            tokens = torch.tensor([tokens])
        if tokens.numel():
            check_token_range(tokens, self._vocab_size(), "to_string's tokens")
        if tokens.ndim == 2:
            return [tok.decode(t, clean_up_tokenization_spaces=False) for t in tokens]
        if tokens.ndim <= 1:
            return tok.decode(tokens.reshape(-1), clean_up_tokenization_spaces=False)
        raise InputError(f"to_string takes rank <= 2 tokens, got shape {tuple(tokens.shape)}")

    def to_str_tokens(self, input, prepend_bos=USE_DEFAULT_VALUE, padding_side=USE_DEFAULT_VALUE):
        """Each token decoded on its own; a list of strings gives one list per string."""
        if isinstance(input, list) and input and isinstance(input[0], str):
            return [self.to_str_tokens(s, prepend_bos, padding_side) for s in input]
        if isinstance(input, str):
            ids = self.to_tokens(input, prepend_bos, padding_side, move_to_device=False)[0]
        else:
            ids = torch.as_tensor(np.asarray(input) if isinstance(input, np.ndarray) else input)
            if ids.ndim == 2:
                if ids.shape[0] != 1:
                    raise InputError(f"to_str_tokens takes one sequence, got shape {tuple(ids.shape)}")
                ids = ids[0]
        tok = self._need_tokenizer()
        if ids.numel():
            check_token_range(ids, self._vocab_size(), "to_str_tokens's input")
        return [tok.decode([int(t)], clean_up_tokenization_spaces=False) for t in ids.reshape(-1)]

    def _vocab_size(self) -> int:
        """Ids the tokenizer or the embedding knows: `[0, max(d_vocab, len(tokenizer)))`."""
        return max(self.cfg.d_vocab, len(self._need_tokenizer()))

    def to_single_token(self, string: str) -> int:
        tokens = self.to_tokens(string, prepend_bos=False, move_to_device=False)[0]
        if tokens.numel() != 1:
            raise InputError(f"{string!r} is {tokens.numel()} tokens, not one: {self.to_str_tokens(tokens)}")
        return int(tokens[0])

    def to_single_str_token(self, int_token: int) -> str:
        check_token_range(torch.tensor([int_token]), self._vocab_size(), "int_token")
        token = self.to_str_tokens(torch.tensor([int_token]))[0]
        assert isinstance(token, str)  # one 1-D sequence decodes to a list of strings
        return token

    def get_token_position(
        self, single_token, input, mode: str = "first", prepend_bos=USE_DEFAULT_VALUE, padding_side=USE_DEFAULT_VALUE
    ) -> int:
        """Index of the first (or last) occurrence of `single_token` in `input`."""
        if mode not in ("first", "last"):
            raise InputError(f"mode must be 'first' or 'last', got {mode!r}")
        tokens = (
            self.to_tokens(input, prepend_bos, padding_side, move_to_device=False) if isinstance(input, str) else input
        )
        tokens = torch.as_tensor(tokens).reshape(-1) if torch.as_tensor(tokens).ndim == 1 else tokens
        if tokens.ndim == 2:
            if tokens.shape[0] != 1:
                raise InputError(f"get_token_position takes one sequence, got shape {tuple(tokens.shape)}")
            tokens = tokens[0]
        token = self.to_single_token(single_token) if isinstance(single_token, str) else int(single_token)
        hits = (tokens.cpu() == token).nonzero().flatten()
        if len(hits) == 0:
            raise ValueError(f"Token {single_token!r} does not occur in the input")
        return int(hits[0] if mode == "first" else hits[-1])

    def token_index(
        self, idx: int | Int[torch.Tensor, "batch"], attention_mask: Int[torch.Tensor, "batch pos"] | None = None
    ) -> Int[torch.Tensor, "batch"]:
        """The absolute column of each row's logical token `idx`, for either padding side.

        Logical 0 is a row's first real token (BOS included) and -1 its last, so under left
        padding -1 is always column -1. Without `attention_mask`, the mask of the last
        forward call is used (all positions real when it had no padding).
        """
        if attention_mask is None:
            state = self.forward_state
            if state is None:
                raise ValueError("token_index needs attention_mask (or a previous forward call)")
            attention_mask = state.attention_mask
            if attention_mask is None:
                attention_mask = torch.ones(state.positions.shape[0], state.n_keys, dtype=torch.long)
        return token_index(idx, attention_mask)


class TokenIndexMixin:
    """`token_index` on its own, under its name from before it joined `TokenizerMixin`.

    A separate class rather than an alias, so that code mixing in both, as `HookedTransformer` once
    did (`class M(TokenizerMixin, TokenIndexMixin)`), still builds.
    """

    token_index = TokenizerMixin.token_index
