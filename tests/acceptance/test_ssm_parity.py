"""State-space and hybrid families against HuggingFace's PyTorch path, float32 (bounds: docs/numerics.md#tolerances).

HF falls back to its reference PyTorch implementations when `mamba_ssm`, `causal_conv1d` and
`flash-linear-attention` are absent (as in this environment): Mamba's sequential selective scan,
Mamba-2's chunked SSD, the gated delta rule's chunked and recurrent forms, LFM2's convolution. Each
case is a tiny random model (`tests/tiny_models.py`, `SSM_CONFIGS`) run on a sequence longer than its
scan chunk:

- Mamba, Mamba-2 (grouped B/C, gated RMSNorm);
- Nemotron-H with Mamba-2, attention and MLP layers;
- Granite-hybrid with Mamba-2 and attention layers, MoE with its shared MLP, every multiplier != 1;
- Qwen3-Next (gated DeltaNet, gated attention, MoE with a shared expert), Qwen3.5 and the text tower of
  its image-text class;
- LFM2 (short convolutions with biases, attention with qk-norm), LFM2-MoE (a dense first layer, then
  sigmoid-routed experts chosen with a selection bias and scaled).
"""

from __future__ import annotations

import pytest
import torch

from tests.helpers import hf_block_outputs, max_abs
from tests.tiny_models import SSM_CONFIGS, hooked_from, ssm_layers, tiny_ssm, tokens

ATOL = 1e-5

#: the layer types each case must hold (so "Nemotron-H with both layer kinds" is checked, not assumed)
LAYER_KINDS = {
    "mamba": {"mamba"},
    "mamba2": {"mamba2"},
    "nemotron_h": {"mamba2", "attention", "mlp"},
    "granite_hybrid_moe": {"mamba2", "attention"},
    "qwen3_next_moe": {"gated_deltanet", "attention"},
    "qwen3_5": {"gated_deltanet", "attention"},
    "qwen3_5_multimodal": {"gated_deltanet", "attention"},
    "lfm2": {"short_conv", "attention"},
    "lfm2_moe": {"short_conv", "attention"},
}
WITH_MOE = {"granite_hybrid_moe", "qwen3_next_moe", "lfm2_moe"}


@pytest.fixture(params=list(SSM_CONFIGS), scope="module")
def case(request):
    hf = tiny_ssm(request.param)
    return request.param, hf, hooked_from(hf)


def test_logits_and_every_resid_post_match_hf(case):
    name, hf, model = case
    t = tokens(2, SSM_CONFIGS[name][3])
    ref = hf_block_outputs(hf, ssm_layers(hf), t)
    with torch.no_grad():
        logits, cache = model.run_with_cache(t, names_filter=lambda n: n.endswith("hook_resid_post"))
        assert max_abs(logits, hf(t).logits) <= ATOL
    assert len(ref) == model.cfg.n_layers
    for layer, hidden in enumerate(ref):
        assert max_abs(cache["resid_post", layer], hidden) <= ATOL, f"layer {layer}"


def test_each_case_has_its_layer_kinds(case):
    name, _, model = case
    assert set(model.cfg.mixer_types) == LAYER_KINDS[name]
    assert model.cfg.uses_moe == (name in WITH_MOE)


def test_processed_matches_hf(case):
    """Default processing (fold_ln into the in-projections, center_unembed) keeps HF's log-probs."""
    from hooked import HookedTransformer

    name, hf, unprocessed = case
    model = HookedTransformer.from_pretrained("processed", hf_model=hf)
    assert "fold_ln" in model.cfg.weight_processing
    t = tokens(2, SSM_CONFIGS[name][3])
    with torch.no_grad():
        ours = model(t).log_softmax(-1)
        assert max_abs(ours, hf(t).logits.log_softmax(-1)) <= ATOL
        assert max_abs(ours, unprocessed(t).log_softmax(-1)) <= ATOL


def test_greedy_generation_equals_hf(case):
    """Prefill, then one token per step through the conv and recurrent states (and the attention layers' KV)."""
    _, hf, model = case
    t = tokens(2, 7, seed=3)
    with torch.no_grad():
        expected = hf.generate(
            t, attention_mask=torch.ones_like(t), max_new_tokens=12, do_sample=False, eos_token_id=None,
            pad_token_id=0,
        )  # fmt: skip
    ours = model.generate(t, max_new_tokens=12, do_sample=False, stop_at_eos=False, verbose=False)
    assert torch.equal(ours, expected)


def test_every_recurrent_layer_changes_the_output(case):
    """Guard against vacuous parity: removing any one recurrent mixer's write moves the logits."""
    name, _, model = case
    t = tokens(2, SSM_CONFIGS[name][3])
    with torch.no_grad():
        plain = model(t)
        for layer in model.cfg.recurrent_layers:
            ablated = model.run_with_hooks(
                t, fwd_hooks=[(f"blocks.{layer}.hook_mixer_out", lambda act, hook: torch.zeros_like(act))]
            )
            assert max_abs(ablated, plain) > 1e-3, f"layer {layer}"


#: bit for bit in bfloat16 (Mamba's residual kept in the model's dtype, `residual_in_fp32=False`: HF's default
#: keeps it in float32, which hooked does not, so those checkpoints are close, not bitwise)
BITWISE_BF16 = {"mamba": dict(residual_in_fp32=False), "mamba2": dict(residual_in_fp32=False)}
#: hooked's bfloat16 logits are at most this many times farther from the float32 logits than HF's
#: (measured: at most 1.02; the hybrids' attention is SDPA here, HF's eager, and their projections are fused
#: differently)
BF16_ERROR_RATIO = 1.25


@pytest.mark.parametrize("name", list(SSM_CONFIGS))
def test_bfloat16_matches_hf(name):
    from hooked import HookedTransformer

    hf = tiny_ssm(name, **BITWISE_BF16.get(name, {}))
    t = tokens(2, SSM_CONFIGS[name][3])
    with torch.no_grad():
        reference = hf(t).logits.double()
        model = HookedTransformer.from_pretrained_no_processing("bf16", hf_model=hf, dtype=torch.bfloat16)
        theirs, ours = hf.to(torch.bfloat16)(t).logits.double(), model(t).double()
    if name in BITWISE_BF16:
        assert torch.equal(ours, theirs)
    else:
        assert max_abs(ours, reference) <= BF16_ERROR_RATIO * max_abs(theirs, reference)


def test_loads_from_a_saved_checkpoint(case, tmp_path):
    """The on-disk names (Granite's `input_linear`, LFM2-MoE's per-expert `w1`, Nemotron-H's `backbone.`) load too."""
    from hooked import HookedTransformer

    name, hf, model = case
    hf.save_pretrained(tmp_path)
    from_disk = HookedTransformer.from_pretrained_no_processing(str(tmp_path))
    t = tokens(2, 12)
    with torch.no_grad():
        assert max_abs(from_disk(t), model(t)) <= ATOL


def test_lfm2_moe_without_an_expert_bias_matches_hf():
    """`use_expert_bias=False`: the sigmoid router's selection bias loads as zeros and chooses as HF's plain top-k."""
    hf = tiny_ssm("lfm2_moe", use_expert_bias=False)
    model = hooked_from(hf)
    assert not hasattr(hf.model.layers[1].feed_forward, "expert_bias")
    assert torch.equal(model.blocks[1].mlp.e_score_correction_bias, torch.zeros(4))
    t = tokens(2, SSM_CONFIGS["lfm2_moe"][3])
    with torch.no_grad():
        assert max_abs(model(t), hf(t).logits) <= ATOL
