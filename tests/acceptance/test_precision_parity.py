"""Half precision: unprocessed models in bfloat16 / float16 against HF run in the same dtype, per family.

HF loads each tiny random checkpoint with `from_pretrained(dtype=...)` (eager attention);
hooked takes that HF model unprocessed in the same dtype. Bound (docs/numerics.md#tolerances, half-precision row):
max |Δ log_softmax| <= max(δ_HF, 1e-2), where δ_HF is HF's own eager-vs-SDPA gap in that dtype
on the same batch (1e-2 alone where HF has no SDPA path). Processing runs in float32 before
the cast, so a processed half-precision model is the processed float32 model cast, bit for bit.
"""

from __future__ import annotations

import pytest
import torch

from hooked.components.norms import RMSNormGainFirst
from hooked.core.dtypes import cast_parameter
from tests.helpers import precision_rows
from tests.tiny_models import EVERY_FAMILY, hooked_from, tokens

pytestmark = pytest.mark.slow  # two HF loads per family and dtype


#: families whose every op runs in HF's order and dtype: equal to HF bit for bit in bf16 and fp16.
#: Family-specific numerics matched (each a converter-set config option, read in one place):
#: GPT-J / GPT-Neo score from float32 q and k (`attn_scores_in_fp32`); Falcon adds biases after
#: the matmul (`bias_after_matmul`) and divides scores by sqrt(d_head) (`attn_scale_divides`);
#: Cohere's LayerNorm multiplies the gain in float32 (`norm_gain_in_fp32` + LN) and rotates in
#: float32 (`rotary_in_fp32`), as OLMo 1/2/3 with float32 tables (`rotary_tables_in_fp32`);
#: StableLM's per-head qk LayerNorm runs one fused `layer_norm` per head. OLMo-2/3 apply their
#: norm gain before the cast; Gemma keeps its norm gain `1 + w` in float32 (`RMSNormGainFirst`);
#: Mixtral weighs expert outputs in float32 and sums a token's slots before one cast (HF's
#: default `grouped_mm` experts); GPT-OSS's router softmax runs over the top-k logits in the model
#: dtype, its experts add biases after the product, and its norm gains stay float32 in float16.
#: MPT adds its float32 ALiBi bias to the scores in the model dtype (`alibi_bias_max`); CodeGen rotates
#: in float32 with float32 tables (`rotary_in_fp32`, `rotary_tables_in_fp32`). Gemma 3n/4 multiply their
#: norm gains `w` in float32 (`norm_gain_in_fp32`); Gemma 3n rounds its per-layer input scales to the
#: model dtype first (`per_layer_scales_in_dtype`).
#: DeepSeek/GLM keep the router weight float32 (`router_in_fp32`) and weigh the experts in float32;
#: MLA builds q, k and v in HF's layouts (heads first) so the attention matmuls round as HF's;
#: DeepSeek-V2 rotates in float32 (`rotary_in_fp32`); DSA's indexer weights stay float32 in float16.
BITWISE = (
    "llama_gqa", "mistral", "qwen2", "qwen3", "gpt2", "neox", "phi", "opt", "bloom",
    "gptj", "gpt_neo", "stablelm_qk_norm", "stablelm_parallel", "bigcode", "starcoder2",
    "falcon_new_arch", "falcon_multi_query", "cohere", "phi3", "granite", "apertus", "smollm3", "olmo",
    "olmoe", "qwen2_moe", "qwen3_moe", "olmo2", "olmo3", "gemma", "gemma2", "gemma3", "gemma3_multimodal",
    "mixtral", "gpt_oss", "mpt", "codegen", "xglm", "hunyuan", "gemma4", "gemma4_multimodal", "gemma3n",
    "deepseek_v2", "deepseek_v3", "glm_moe_dsa", "glm4_moe", "phimoe",
)  # fmt: skip
#: families bit for bit in bfloat16 only, and why float16 is not (it is within the half-precision bound)
BITWISE_BF16_ONLY = {
    # the residual stream is bit for bit; Granite's `1 / logits_scaling` (0.25) is folded into W_U, and in
    # float16 that product rounds W_U's subnormal entries (bfloat16 has no subnormals at these magnitudes)
    "granitemoe": "logits_scaling folded into a float16 W_U",
}


def _rows(family: str, dtypes: list[torch.dtype]) -> list[dict]:
    return precision_rows(family, dtypes, tokens(2, 12) % 90)


@pytest.mark.parametrize("family", BITWISE)
def test_bitwise_families_equal_hf_in_half_precision(family):
    for row in _rows(family, [torch.bfloat16, torch.float16]):
        assert row["bitwise"] and row["hooked_vs_hf"] == 0.0, row


def test_every_family_is_bitwise():
    assert set(BITWISE) | set(BITWISE_BF16_ONLY) == set(EVERY_FAMILY)


@pytest.mark.parametrize("family", list(BITWISE_BF16_ONLY))
def test_bf16_bitwise_families_and_their_float16_bound(family):
    bf16, fp16 = _rows(family, [torch.bfloat16, torch.float16])
    assert bf16["bitwise"] and bf16["hooked_vs_hf"] == 0.0, bf16
    assert not fp16["bitwise"] and fp16["hooked_vs_hf"] <= max(fp16["hf_eager_vs_sdpa"] or 0.0, 1e-2), fp16


@pytest.mark.parametrize("family", [*BITWISE, *BITWISE_BF16_ONLY])
def test_hooks_that_return_copies_change_nothing_in_half_precision(family):
    """Hook transparency below float32 (docs/numerics.md#tolerances): caching every activation, or a hook
    on every hook point returning an equal copy, gives the plain forward's logits bit for bit (no path
    recomputes differently)."""
    ours = hooked_from(EVERY_FAMILY[family](), dtype=torch.bfloat16)
    ours.cfg.attn_implementation = "eager"
    t = tokens(2, 12) % 90
    plain = ours(t)
    copied = ours.run_with_hooks(t, fwd_hooks=[(lambda name: True, lambda x, hook: x.clone())])
    cached, _ = ours.run_with_cache(t)
    assert torch.equal(copied, plain) and torch.equal(cached, plain)


def test_every_supported_architecture_has_a_family():
    """Decoders here; image-text models (VLM_CONFIGS) in tests/acceptance/test_vision_language_parity.py;
    state-space and hybrid models (SSM_CONFIGS, bfloat16) in tests/acceptance/test_ssm_parity.py."""
    from hooked.loading.registry import supported_architectures
    from tests.tiny_models import SSM_CONFIGS, VLM_CONFIGS, tiny_vlm

    covered = {type(build()).__name__ for build in EVERY_FAMILY.values()}
    covered |= {type(tiny_vlm(name)).__name__ for name in VLM_CONFIGS}
    covered |= {model_class for model_class, *_ in SSM_CONFIGS.values()}
    assert covered == set(supported_architectures())


@pytest.mark.parametrize("family", ["llama_gqa", "gpt2", "gemma3"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_processing_runs_in_float32_before_the_cast(family, dtype):
    hf = EVERY_FAMILY[family]()
    half = hooked_from(hf, dtype=dtype, fold_ln=True, center_writing_weights=True, center_unembed=True)
    full = hooked_from(hf, dtype=torch.float32, fold_ln=True, center_writing_weights=True, center_unembed=True)
    assert half.cfg.weight_processing == full.cfg.weight_processing != ()
    full_state = full.state_dict()
    if half.cfg.embed_scale is not None:  # Gemma: `e * sqrt(d_model)` is converted in the model dtype, as HF
        full_state["embed.W_E"] = hooked_from(hf, dtype=dtype).W_E.float()  # (RMSNorm models: processing keeps W_E)
    for name, tensor in half.state_dict().items():
        module_name, leaf = name.rsplit(".", 1)
        module = half.get_submodule(module_name)
        # the model's cast: `.to(dtype)`, except the unfolded Gemma gains `1 + w`
        # (post- and qk-norms: float32, w rounded)
        expected = cast_parameter(module, leaf, full_state[name], dtype)
        assert tensor.dtype == (torch.float32 if isinstance(module, RMSNormGainFirst) else dtype), name
        torch.testing.assert_close(tensor, expected, atol=0, rtol=0, msg=name)
