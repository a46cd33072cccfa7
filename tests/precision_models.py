"""One tiny random HF model per family, for the half-precision parity test and benchmarks/precision.py."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path

import torch


def _modern(prefix: str, **overrides) -> Callable:
    def build(seed: int = 0):
        from tests.acceptance.tiny_models import tiny_hf

        return tiny_hf(prefix, seed=seed, **overrides)

    return build


def _classic(name: str) -> Callable:
    def build(seed: int = 0):
        from tests.classic_models import tiny_classic

        return tiny_classic(name, seed=seed)

    return build


def _gpt2(seed: int = 0):
    from tests.helpers import tiny_gpt2

    return tiny_gpt2(seed=seed, vocab_size=96, n_positions=64)


def _gemma(name: str) -> Callable:
    def build(seed: int = 0):
        from tests.acceptance.test_gemma_parity import tiny_gemma

        return tiny_gemma(name, seed=seed)

    return build


def _moe(name: str) -> Callable:
    def build(seed: int = 0):
        from tests.acceptance.test_moe_parity import CONFIGS, tiny_moe

        prefix, overrides = CONFIGS[name]
        return tiny_moe(prefix, seed=seed, **overrides)

    return build


PHI3 = dict(
    num_attention_heads=2,
    num_key_value_heads=1,
    original_max_position_embeddings=16,
    rope_parameters=dict(
        rope_type="longrope",
        rope_theta=1e4,
        partial_rotary_factor=0.5,
        short_factor=[1.0, 1.3, 2.0, 3.0],
        long_factor=[2.0, 3.0, 5.0, 9.0],
    ),
)
GRANITE = dict(
    num_key_value_heads=2,
    tie_word_embeddings=True,
    embedding_multiplier=3.0,
    attention_multiplier=0.3,
    residual_multiplier=0.5,
    logits_scaling=4.0,
)
OLMO3 = dict(
    num_key_value_heads=2,
    sliding_window=4,
    layer_types=["sliding_attention", "full_attention"],
    rope_parameters=dict(
        sliding_attention=dict(rope_type="default", rope_theta=1e4),
        full_attention=dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=8, rope_theta=5e5),
    ),
)

#: family -> builder of a tiny random HF model (eager attention, float32)
FAMILIES: dict[str, Callable[..., torch.nn.Module]] = {
    "gpt2": _gpt2,
    "llama_gqa": _modern("Llama", num_key_value_heads=2),
    "mistral": _modern("Mistral", num_key_value_heads=2),
    "qwen2": _modern("Qwen2", num_key_value_heads=2),
    "qwen3": _modern("Qwen3", num_key_value_heads=2),
    "olmo2": _modern("Olmo2"),
    "gemma2": _gemma("gemma2_softcaps_window"),
    "gemma3": _gemma("gemma3_mixed_rope"),
    "mixtral": _moe("mixtral"),
    "neox": _classic("neox_parallel_rot025"),
    "phi": _classic("phi_rot05"),
    "opt": _classic("opt"),
    "bloom": _classic("bloom_6heads"),
    "gptj": _classic("gptj_rotary8of16"),
    "gpt_neo": _classic("gpt_neo_window4"),
    "stablelm_qk_norm": _classic("stablelm_qk_norm_gqa"),
    "stablelm_parallel": _classic("stablelm_parallel"),
    "bigcode": _classic("bigcode_mqa"),
    "starcoder2": _classic("starcoder2_gqa_window5"),
    "falcon_new_arch": _modern("Falcon", new_decoder_architecture=True, num_kv_heads=2, bias=True),
    "falcon_multi_query": _modern("Falcon", multi_query=True, parallel_attn=True, bias=True),
    "cohere": _modern("Cohere", num_key_value_heads=2, use_qk_norm=True, logit_scale=0.5),
    "phi3": _modern("Phi3", **PHI3, sliding_window=6),
    "granite": _modern("Granite", **GRANITE),
    "apertus": _modern("Apertus", num_key_value_heads=2),
    "smollm3": _modern("SmolLM3", num_key_value_heads=2, no_rope_layer_interval=2),
    "olmo": _modern("Olmo", num_key_value_heads=2, clip_qkv=0.5),
    "olmo3": _modern("Olmo3", **OLMO3),
    "gemma": _gemma("gemma1_mqa_tied"),
    "gemma3_multimodal": _gemma("gemma3_image_text_tower"),
    "olmoe": _moe("olmoe_clip_qkv"),
    "qwen2_moe": _moe("qwen2_moe_shared_expert"),
    "qwen3_moe": _moe("qwen3_moe_norm_topk"),
    "gpt_oss": _moe("gpt_oss_sinks_clamped_swiglu"),
}


def _logprobs(x: torch.Tensor) -> torch.Tensor:
    return x.double().log_softmax(-1)


def _sdpa_logits(directory: Path, dtype: torch.dtype, tokens: torch.Tensor) -> torch.Tensor | None:
    from transformers import AutoModelForCausalLM

    try:
        hf = AutoModelForCausalLM.from_pretrained(directory, dtype=dtype, attn_implementation="sdpa")
        hf = hf.to(tokens.device).eval()
    except ValueError:  # e.g. Gemma 2 (soft-capped scores): HF refuses SDPA
        return None
    with torch.no_grad():
        return hf(tokens).logits


def precision_rows(
    family: str, dtypes: list[torch.dtype], tokens: torch.Tensor, device: str | torch.device = "cpu"
) -> list[dict]:
    """Per dtype: max |Δ log_softmax| of hooked vs HF eager, HF eager vs HF SDPA (δ_HF in docs/numerics.md),
    and each vs float32.

    HF loads the saved float32 checkpoint with `from_pretrained(dtype=...)`, as users run it
    (rotary frequencies stay float32); hooked takes that HF model unprocessed, in that dtype, with
    eager attention as HF's (hooked's default SDPA path is compared with HF's SDPA by δ_HF's size).
    Both run on `device` (the checkpoint is built and saved on the CPU).
    """
    from transformers import AutoModelForCausalLM

    from tests.helpers import hooked_from

    hf32 = FAMILIES[family]()
    tokens = tokens.to(device)
    hf32.to(device)
    with torch.no_grad():
        fp32 = _logprobs(hf32(tokens).logits)
    rows = []
    with tempfile.TemporaryDirectory() as directory:
        hf32.save_pretrained(directory)
        for dtype in dtypes:
            hf = AutoModelForCausalLM.from_pretrained(Path(directory), dtype=dtype, attn_implementation="eager")
            hf = hf.to(device).eval()
            sdpa = _sdpa_logits(Path(directory), dtype, tokens)  # None: HF has no SDPA path for the family
            ours = hooked_from(hf, dtype=dtype, device=device)
            ours.cfg.attn_implementation = "eager"  # the same attention path as the HF reference
            with torch.no_grad():
                hf_logits, our_logits = hf(tokens).logits, ours(tokens)
            hf_lp, our_lp = _logprobs(hf_logits), _logprobs(our_logits)
            rows.append(
                dict(
                    family=family,
                    dtype=str(dtype).removeprefix("torch."),
                    bitwise=bool(torch.equal(hf_logits, our_logits)),
                    hooked_vs_hf=(our_lp - hf_lp).abs().max().item(),
                    hf_eager_vs_sdpa=None if sdpa is None else (_logprobs(sdpa) - hf_lp).abs().max().item(),
                    hf_vs_fp32=(hf_lp - fp32).abs().max().item(),
                    hooked_vs_fp32=(our_lp - fp32).abs().max().item(),
                )
            )
    return rows
