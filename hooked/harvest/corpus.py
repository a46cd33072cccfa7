"""Corpora for harvesting: text files, JSONL, token tensors or a `datasets` dataset, cut into model contexts.

A corpus yields documents (a str, or a 1-D tensor of token ids) in a fixed order; `iter_contexts`
turns them into `[context_length]` rows either as TransformerLens's `tokenize_and_concatenate`
("concat": documents joined with EOS, BOS at the start of each context, the last partial context
dropped) or one document per context ("document": BOS + the document, split at the context length,
padded in the batch and the padding never stored).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from jaxtyping import Bool, Int

from hooked.core.errors import InputError

TEXT_SUFFIXES = (".txt", ".jsonl")
TENSOR_SUFFIXES = (".pt", ".safetensors")
TOKENIZATIONS = ("concat", "document")


@dataclass
class Batch:
    """One batch of contexts; `mask` is False on padding (document tokenization only)."""

    tokens: Int[torch.Tensor, "batch pos"]
    doc_index: Int[torch.Tensor, "batch pos"]  # which corpus document each token came from (-1: BOS/padding)
    mask: Bool[torch.Tensor, "batch pos"]

    @property
    def n_tokens(self) -> int:
        return int(self.mask.sum())


class Corpus:
    """A fixed-order sequence of documents read lazily from `source` (a path or a `datasets` dataset)."""

    def __init__(self, source: Any, text_field: str = "text"):
        self.source, self.text_field = source, text_field
        if isinstance(source, (str, os.PathLike)):
            self.path = Path(source)
            if not self.path.exists():
                raise InputError(
                    f"Corpus {str(self.path)!r} does not exist: pass a text/JSONL file, a directory "
                    f"of them, a .pt/.safetensors token tensor or a saved `datasets` dataset."
                )
            self.files = self._files(self.path)
        else:
            self.path, self.files = None, []

    @staticmethod
    def _files(path: Path) -> list[Path]:
        if path.is_file():
            return [path]
        if (path / "dataset_info.json").exists() or (path / "state.json").exists():
            return []  # a `datasets.save_to_disk` directory
        files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in TEXT_SUFFIXES + TENSOR_SUFFIXES)
        if not files:
            raise InputError(
                f"Corpus directory {str(path)!r} holds no {', '.join(TEXT_SUFFIXES + TENSOR_SUFFIXES)} files."
            )
        return files

    def _dataset(self) -> Any:  # any iterable of dict rows (a datasets.Dataset, a list, a generator)
        if self.path is None:
            return self.source
        import datasets  # only for saved datasets

        return datasets.load_from_disk(str(self.path))

    @property
    def fingerprint(self) -> str:
        """sha256 of the file names and contents (or the dataset's own fingerprint)."""
        h = hashlib.sha256()
        if not self.files or self.path is None:  # (files come with a path)
            ds = self._dataset()
            h.update(str(getattr(ds, "_fingerprint", None) or repr(ds)).encode())
            return h.hexdigest()
        for f in self.files:
            h.update(str(f.relative_to(self.path) if self.path.is_dir() else f.name).encode() + b"\0")
            with open(f, "rb") as fh:
                while chunk := fh.read(1 << 20):
                    h.update(chunk)
        return h.hexdigest()

    def documents(self) -> Iterator[str | torch.Tensor]:
        """Every document in order: a str (text) or a 1-D LongTensor (pre-tokenized rows)."""
        if not self.files:
            for row in self._dataset():
                yield from _row_documents(row, self.text_field)
            return
        for f in self.files:
            if f.suffix in TENSOR_SUFFIXES:
                yield from _tensor_documents(f)
            elif f.suffix == ".jsonl":
                yield from _jsonl_documents(f, self.text_field)
            else:
                yield f.read_text(encoding="utf-8")


def _row_documents(row: dict, field: str) -> Iterator[str | torch.Tensor]:
    for key in ("tokens", "input_ids"):
        if key in row:
            yield torch.as_tensor(row[key], dtype=torch.long).flatten()
            return
    if field not in row:
        raise InputError(f"Dataset rows have no {field!r} column (columns: {sorted(row)}); pass text_field=...")
    yield row[field]


def _jsonl_documents(path: Path, field: str) -> Iterator[str]:
    with open(path, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if line.strip():
                record = json.loads(line)
                if field not in record:
                    raise InputError(f"{path}:{n} has no {field!r} field (keys: {sorted(record)}).")
                yield record[field]


def _tensor_documents(path: Path) -> Iterator[torch.Tensor]:
    """Each row of a 2-D token tensor is one document; a 1-D tensor is one long document."""
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        tensors = load_file(str(path))
        key = next((k for k in tensors if "token" in k or "input_ids" in k), None) or next(iter(tensors), None)
        tensor = tensors.get(key) if key is not None else None
    else:
        tensor = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(tensor, torch.Tensor) or tensor.dtype.is_floating_point or tensor.dim() not in (1, 2):
        raise InputError(f"{path} must hold a 1-D or 2-D integer token tensor.")
    yield from tensor.long().reshape(-1, tensor.shape[-1])


def special_ids(tokenizer) -> tuple[int, int, int]:
    """(bos, eos, pad) ids: BOS falls back to EOS (as GPT-2's), PAD to EOS."""
    if tokenizer is None:
        return 0, 0, 0  # only pre-tokenized contexts can be used (checked when a document needs them)
    eos = tokenizer.eos_token_id
    bos = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else eos
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    if bos is None:
        raise InputError("The tokenizer has neither a BOS nor an EOS token, so contexts cannot start with one.")
    return bos, (eos if eos is not None else bos), pad


def _token_stream(corpus: Corpus, tokenizer, context_length: int):
    """Yield `(tokens, doc_index, is_context)`: is_context marks a pre-tokenized row of exactly context_length."""
    for i, doc in enumerate(corpus.documents()):
        if isinstance(doc, str):
            if tokenizer is None:
                raise InputError("Harvesting text needs a tokenizer: load the model with one or pass token tensors.")
            doc = torch.tensor(tokenizer(doc, add_special_tokens=False)["input_ids"], dtype=torch.long)
        elif doc.numel() == context_length:
            yield doc, i, True
            continue
        elif tokenizer is None:
            raise InputError(
                f"Token row {i} is {doc.numel()} tokens, not context_length={context_length}: cutting "
                f"it into contexts needs BOS/EOS ids, so load the model with its tokenizer."
            )
        if doc.numel():
            yield doc, i, False


def iter_contexts(corpus: Corpus, tokenizer, context_length: int, tokenization: str = "concat"):
    """Yield `(tokens [n], doc_index [n])` per context, n = context_length (concat) or <= it (document).

    Rows of a token tensor exactly `context_length` wide are taken as finished contexts, unchanged.
    """
    if tokenization not in TOKENIZATIONS:
        raise InputError(f"tokenization={tokenization!r}: choose 'concat' or 'document'.")
    bos, eos, _ = special_ids(tokenizer)
    split = _document_contexts if tokenization == "document" else _concat_contexts
    yield from split(corpus, tokenizer, context_length, bos, eos)


def _document_contexts(corpus: Corpus, tokenizer, context_length: int, bos: int, eos: int):
    """Each document its own contexts: BOS, then up to `context_length - 1` of its tokens (the last one shorter)."""
    body = context_length - 1
    for doc, i, is_context in _token_stream(corpus, tokenizer, context_length):
        if is_context:
            yield doc, torch.full_like(doc, i)
            continue
        for start in range(0, doc.numel(), body):
            piece = doc[start : start + body]
            yield (
                torch.cat([torch.tensor([bos]), piece]),
                torch.cat([torch.tensor([-1]), torch.full_like(piece, i)]),
            )


def _concat_contexts(corpus: Corpus, tokenizer, context_length: int, bos: int, eos: int):
    """TransformerLens's `tokenize_and_concatenate`: documents joined with EOS, cut into BOS + `context_length - 1`."""
    body = context_length - 1
    buf, idx, n = [], [], 0
    for doc, i, is_context in _token_stream(corpus, tokenizer, context_length):
        if is_context:
            yield doc, torch.full_like(doc, i)
            continue
        if idx:  # TransformerLens joins documents with EOS
            buf.append(torch.tensor([eos]))
            idx.append(torch.tensor([i]))
            n += 1
        buf.append(doc)
        idx.append(torch.full_like(doc, i))
        n += doc.numel()
        if n >= body:
            flat, flat_idx = torch.cat(buf), torch.cat(idx)
            while flat.numel() >= body:
                yield torch.cat([torch.tensor([bos]), flat[:body]]), torch.cat([torch.tensor([-1]), flat_idx[:body]])
                flat, flat_idx = flat[body:], flat_idx[body:]
            buf, idx, n = [flat], [flat_idx], flat.numel()


@dataclass
class Plan:
    """How much a harvest will store, when the corpus was small enough to tokenize up front (else None fields)."""

    contexts: Iterator  # every context, in order (the buffered ones first)
    n_contexts: int | None  # contexts that fit in max_tokens
    n_tokens: int | None  # real tokens in them

    def n_batches(self, batch_size: int) -> int | None:
        return None if self.n_contexts is None else -(-self.n_contexts // batch_size)


def plan(contexts: Iterator, max_tokens: int | None, limit_tokens: int) -> Plan:
    """Buffer contexts until the corpus (or `max_tokens`) ends, to know its size; give up past `limit_tokens`.

    The buffered contexts are handed on, so the corpus is tokenized once either way.
    """
    contexts = iter(contexts)
    buffered, n_tokens = [], 0
    for tokens, doc_index in contexts:
        buffered.append((tokens, doc_index))
        if max_tokens is not None and n_tokens + tokens.numel() > max_tokens:
            return Plan(itertools.chain(buffered, contexts), len(buffered) - 1, n_tokens)
        n_tokens += tokens.numel()
        if n_tokens > limit_tokens:
            return Plan(itertools.chain(buffered, contexts), None, None)
    return Plan(iter(buffered), len(buffered), n_tokens)


def iter_batches(contexts, batch_size: int, max_tokens: int | None, pad_id: int) -> Iterator[Batch]:
    """Group contexts into batches (right-padded), stopping before `max_tokens` real tokens are exceeded."""
    seen, pending = 0, []
    for tokens, doc_index in contexts:
        if max_tokens is not None and seen + tokens.numel() > max_tokens:
            break
        seen += tokens.numel()
        pending.append((tokens, doc_index))
        if len(pending) == batch_size:
            yield _collate(pending, pad_id)
            pending = []
    if pending:
        yield _collate(pending, pad_id)


def _collate(rows, pad_id: int) -> Batch:
    width = max(t.numel() for t, _ in rows)
    tokens = torch.full((len(rows), width), pad_id, dtype=torch.long)  # [batch, pos]
    doc_index = torch.full((len(rows), width), -1, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.bool)
    for r, (t, d) in enumerate(rows):
        tokens[r, : t.numel()], doc_index[r, : t.numel()], mask[r, : t.numel()] = t, d, True
    return Batch(tokens, doc_index, mask)
