"""The bundled real models in half precision, unprocessed, against HF loading the same checkpoint in that dtype.

Bit for bit (docs/numerics.md#half-precision) (the tiny models of every family:
tests/acceptance/test_precision_parity.py).
Gemma-3-270M is checked in bfloat16 only: in float16 its activations overflow, in HF as in hooked.
"""

from __future__ import annotations

import pytest
import torch

from hooked import HookedTransformer

pytestmark = pytest.mark.slow

PROMPTS = ["The Eiffel Tower is in the city of", "When Mary and John went to the store, John gave a drink to"]


@pytest.mark.parametrize(
    "name, dtype",
    [("smollm2-135m", torch.bfloat16), ("smollm2-135m", torch.float16), ("gemma-3-270m", torch.bfloat16)],
)
def test_bundled_model_equals_hf_bitwise_in_half_precision(name, dtype):
    from transformers import AutoModelForCausalLM

    from hooked.loading.bundled import bundled_checkpoint_dir

    hf = AutoModelForCausalLM.from_pretrained(bundled_checkpoint_dir(name), dtype=dtype, attn_implementation="eager")
    ours = HookedTransformer.from_pretrained_no_processing(name, dtype=dtype)
    ours.cfg.attn_implementation = "eager"  # HF's reference path (SDPA is compared with HF's SDPA elsewhere)
    tokens, mask = ours.tokenizer(PROMPTS, padding=True, return_tensors="pt").values()  # right-padded batch
    with torch.no_grad():
        want = hf.eval()(tokens, attention_mask=mask).logits
    got = ours(tokens, attention_mask=mask)
    real = mask.bool()  # docs/numerics.md#tolerances: real (unmasked) positions
    assert got.dtype == dtype and torch.isfinite(got[real]).all()
    assert torch.equal(got[real], want[real]), (got[real].double() - want[real].double()).abs().max().item()


def test_smollm2_greedy_generation_equals_hf_bitwise_in_bfloat16():
    """KV-cached decoding too: a left-padded batch, every step's logits equal to HF `generate`'s, bit for bit."""
    from transformers import AutoModelForCausalLM

    from hooked.loading.bundled import bundled_checkpoint_dir

    hf = AutoModelForCausalLM.from_pretrained(bundled_checkpoint_dir("smollm2-135m"), dtype=torch.bfloat16).eval()
    ours = HookedTransformer.from_pretrained_no_processing("smollm2-135m", dtype=torch.bfloat16)
    ours.tokenizer.padding_side = "left"
    tokens, mask = ours.tokenizer(
        ["The Eiffel Tower is in the city of", "Hi"], padding=True, return_tensors="pt"
    ).values()
    got = ours.generate(tokens, attention_mask=mask, max_new_tokens=30, do_sample=False, verbose=False,
                        stop_at_eos=False, output_logits=True)  # fmt: skip
    with torch.no_grad():
        want = hf.generate(tokens, attention_mask=mask, max_new_tokens=30, min_new_tokens=30, do_sample=False,
                           output_logits=True, return_dict_in_generate=True,
                           pad_token_id=ours.tokenizer.pad_token_id)  # fmt: skip
    assert torch.equal(got.sequences, want.sequences)
    for step, (a, b) in enumerate(zip(got.logits, want.logits, strict=True)):
        assert torch.equal(a, b), (step, (a.double() - b.double()).abs().max().item())
