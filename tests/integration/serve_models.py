"""Tiny checkpoints (with a tokenizer) for the `hooked serve` tests: GPT-2 and a GQA Llama."""

from __future__ import annotations

from pathlib import Path

TOKENS = {"alice": "alice-token-0123456789", "bob": "bob-token-0123456789ab"}


def save_tiny(kind: str, directory: Path) -> Path:
    """A tiny random checkpoint directory `from_pretrained` (and `hooked serve --model`) can load."""
    from tests.tiny_models import make_tokenizer, tiny_gpt2, tiny_hf

    if kind == "gpt2":
        hf = tiny_gpt2(n_positions=64, vocab_size=300, bos_token_id=0, eos_token_id=0)
    elif kind == "llama_gqa":
        hf = tiny_hf(
            "Llama",
            vocab_size=300,
            num_key_value_heads=2,
            tie_word_embeddings=False,
            bos_token_id=1,
            eos_token_id=0,
            pad_token_id=2,
        )
    else:
        raise ValueError(kind)
    hf.save_pretrained(directory)
    make_tokenizer(prepends_bos=kind == "llama_gqa").save_pretrained(directory)
    return directory
