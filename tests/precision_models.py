"""One tiny random HF model per family, for the half-precision parity test and benchmarks/precision.py."""

from __future__ import annotations

from typing import Callable

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
}
