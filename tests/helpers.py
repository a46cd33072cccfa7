"""Shared builders for tests: tiny random HF models, their hooked twins, and small tokenizers."""

from __future__ import annotations

import torch

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "When Mary and John went to the store, John gave a drink to Mary.",
    "The Eiffel Tower is in the city of Paris.",
    "The capital of France is Paris, and the capital of Italy is Rome.",
    "Hooks let you read and rewrite every activation of a transformer.",
]

NO_PROCESSING = dict(fold_ln=False, center_writing_weights=False, center_unembed=False, fold_value_biases=False)


def make_tokenizer(prepends_bos: bool = False, vocab_size: int = 300):
    """A byte-level BPE tokenizer trained on a few sentences; optionally adds BOS like LLaMA's."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<s>", "<pad>"]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(CORPUS, trainer)
    if prepends_bos:
        bos_id = tok.token_to_id("<s>")
        tok.post_processor = processors.TemplateProcessing(
            single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos_id)]
        )
        return PreTrainedTokenizerFast(
            tokenizer_object=tok, bos_token="<s>", eos_token="<|endoftext|>", pad_token="<pad>"
        )
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>")


def tiny_gpt2(seed: int = 0, **overrides):
    """A random HF GPT-2 (eager attention) with small dimensions; overrides go to GPT2Config."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    kwargs = dict(n_layer=2, n_embd=64, n_head=4, vocab_size=1000, n_positions=128, attn_implementation="eager")
    kwargs.update(overrides)
    config = GPT2Config(**kwargs)
    hf = GPT2LMHeadModel(config).eval()
    with torch.no_grad():  # random biases and norm parameters, so the parity test exercises them
        for name, p in hf.named_parameters():
            if name.endswith("bias") or "ln" in name:
                p.add_(torch.randn_like(p) * 0.1)
    return hf


def hooked_from(hf, tokenizer=None, **kwargs):
    from hooked import HookedTransformer

    options = dict(NO_PROCESSING)
    options.update(kwargs)
    return HookedTransformer.from_pretrained("gpt2", hf_model=hf, tokenizer=tokenizer, **options)


def hf_block_outputs(hf, blocks, *args, **kwargs) -> list[torch.Tensor]:
    """Run `hf(*args)` and return each decoder block's output hidden state."""
    outputs = []
    handles = [
        b.register_forward_hook(lambda m, i, o: outputs.append(o[0] if isinstance(o, tuple) else o)) for b in blocks
    ]
    try:
        with torch.no_grad():
            hf(*args, **kwargs)
    finally:
        for h in handles:
            h.remove()
    return outputs
