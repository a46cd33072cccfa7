"""The bundled real model (SmolLM2-135M-Instruct, float32) against HuggingFace on real text."""

import pytest
import torch
import torch.nn.functional as F

pytestmark = pytest.mark.slow


def hf_log_probs(hf, tokens, implementation):
    hf.set_attn_implementation(implementation)
    try:
        with torch.no_grad():
            return F.log_softmax(hf(tokens).logits.float(), dim=-1)
    finally:
        hf.set_attn_implementation("eager")


@pytest.fixture(scope="module")
def hf_reference(smollm2_hf, smollm2_batch):
    eager = hf_log_probs(smollm2_hf, smollm2_batch, "eager")
    sdpa = hf_log_probs(smollm2_hf, smollm2_batch, "sdpa")
    delta_hf = (eager - sdpa).abs().max().item()
    return eager, sdpa, delta_hf


def hooked_log_probs(model, tokens, implementation):
    model.cfg.attn_implementation = implementation
    try:
        with torch.no_grad():
            return F.log_softmax(model(tokens).float(), dim=-1)
    finally:
        model.cfg.attn_implementation = "auto"


@pytest.mark.parametrize("implementation", ["eager", "auto"])
def test_log_softmax_within_hf_own_eager_vs_sdpa_gap(smollm2, smollm2_batch, hf_reference, implementation):
    """Real-model parity (docs/numerics.md#tolerances): <= max(delta_HF, 5e-5) against HF with the same
    attention implementation."""
    eager, sdpa, delta_hf = hf_reference
    ours = hooked_log_probs(smollm2, smollm2_batch, implementation)
    ref = eager if implementation == "eager" else sdpa
    diff = (ours - ref).abs().max().item()
    print(
        f"\n[{implementation}] max |log_softmax(hooked) - log_softmax(HF)| = {diff:.3e}; "
        f"HF eager vs SDPA = {delta_hf:.3e}"
    )
    assert diff <= max(delta_hf, 5e-5)
    assert (ours.argmax(-1) == ref.argmax(-1)).all()


def test_processed_model_is_invariant(smollm2, smollm2_processed, smollm2_batch, hf_reference):
    """Folding invariance on real models (docs/numerics.md#tolerances): log_softmax(processed) vs
    unprocessed within 1e-4."""
    eager, _, delta_hf = hf_reference
    processed = hooked_log_probs(smollm2_processed, smollm2_batch, "eager")
    unprocessed = hooked_log_probs(smollm2, smollm2_batch, "eager")
    vs_unprocessed = (processed - unprocessed).abs().max().item()
    vs_hf = (processed - eager).abs().max().item()
    print(
        f"\nprocessed vs unprocessed {vs_unprocessed:.3e}; processed vs HF eager {vs_hf:.3e}; "
        f"HF eager vs SDPA {delta_hf:.3e}"
    )
    assert vs_unprocessed <= 1e-4
    assert (processed.argmax(-1) == eager.argmax(-1)).all()


def test_loss_matches_hf(smollm2, smollm2_hf, smollm2_batch):
    with torch.no_grad():
        ours = smollm2(smollm2_batch, return_type="loss")
        ref = smollm2_hf(smollm2_batch, labels=smollm2_batch).loss
    print(f"\nloss hooked {ours.item():.6f} HF {ref.item():.6f}")
    assert abs(ours.item() - ref.item()) <= 1e-4


def test_capital_of_france_is_paris(smollm2_processed):
    logits = smollm2_processed("The capital of France is")
    assert smollm2_processed.to_single_str_token(int(logits[0, -1].argmax())) == " Paris"


def test_kv_heads_grouped_and_ungrouped(smollm2):
    tokens = smollm2.to_tokens("The Eiffel Tower is in the city of")
    with torch.no_grad():
        grouped, cache = smollm2.run_with_cache(tokens, names_filter=lambda n: n.endswith(("hook_k", "hook_v")))
        smollm2.set_ungroup_grouped_query_attention(True)
        try:
            ungrouped, ucache = smollm2.run_with_cache(tokens, names_filter=lambda n: n.endswith(("hook_k", "hook_v")))
        finally:
            smollm2.set_ungroup_grouped_query_attention(False)
    p = tokens.shape[1]
    assert cache["k", 0].shape == (1, p, 3, 64) and ucache["v", 5].shape == (1, p, 9, 64)
    torch.testing.assert_close(ungrouped, grouped, atol=1e-5, rtol=0)
    torch.testing.assert_close(ucache["k", 3], cache["k", 3].repeat_interleave(3, dim=2), atol=0, rtol=0)


def test_padded_batch_equals_prompts_alone(smollm2):
    prompts = [
        "The capital of France is",
        "def add(a, b):\n    return",
        "Once upon a time, in a small village by the sea,",
    ]
    with torch.no_grad():
        batched = smollm2(prompts, padding_side="left")
        right = smollm2(prompts, padding_side="right")
        for i, p in enumerate(prompts):
            alone = smollm2(p)[0]
            torch.testing.assert_close(batched[i, -alone.shape[0] :], alone, atol=1e-4, rtol=0)
            torch.testing.assert_close(right[i, : alone.shape[0]], alone, atol=1e-4, rtol=0)
