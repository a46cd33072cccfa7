"""HF configs of official model names, known without the hub.

A user without hub access (or before downloading weights) can build a named model's
architecture: `official_hf_config(name)` returns the `transformers` config the hub's
`config.json` holds, and the family's converter turns it into a `HookedTransformerConfig`
as for a downloaded checkpoint. Only the fields that differ from the `transformers`
defaults are listed. Image-text Gemma 3 checkpoints are listed by their language model
(a `Gemma3TextConfig`, vocabulary 262208, linear RoPE scaling x8 on global layers).
"""

from __future__ import annotations

from typing import Any

_GEMMA3_SMALL = dict(
    sliding_window=512, vocab_size=262144, max_position_embeddings=32768, head_dim=256, query_pre_attn_scalar=256
)
_GEMMA3_LARGE = dict(
    sliding_window=1024,
    vocab_size=262208,
    max_position_embeddings=131072,
    rope_scaling={"rope_type": "linear", "factor": 8.0},
)


def _gemma3(d_model: int, d_mlp: int, n_layers: int, n_heads: int, n_kv: int, **rest) -> dict:
    return dict(
        hidden_size=d_model,
        intermediate_size=d_mlp,
        num_hidden_layers=n_layers,
        num_attention_heads=n_heads,
        num_key_value_heads=n_kv,
        **rest,
    )


_GEMMA3 = {
    "270m": ("Gemma3ForCausalLM", _gemma3(640, 2048, 18, 4, 1, **_GEMMA3_SMALL)),
    "1b": ("Gemma3ForCausalLM", _gemma3(1152, 6912, 26, 4, 1, **_GEMMA3_SMALL)),
    "4b": (
        "Gemma3ForConditionalGeneration",
        _gemma3(2560, 10240, 34, 8, 4, head_dim=256, query_pre_attn_scalar=256, **_GEMMA3_LARGE),
    ),
    "12b": (
        "Gemma3ForConditionalGeneration",
        _gemma3(3840, 15360, 48, 16, 8, head_dim=256, query_pre_attn_scalar=256, **_GEMMA3_LARGE),
    ),
    "27b": (
        "Gemma3ForConditionalGeneration",
        _gemma3(5376, 21504, 62, 32, 16, head_dim=128, query_pre_attn_scalar=168, **_GEMMA3_LARGE),
    ),
}

# official name -> (HF architecture, config class name, config fields)
OFFICIAL_HF_CONFIGS: dict[str, tuple[str, str, dict]] = {
    **{
        f"google/gemma-3-{size}{v}": (*_GEMMA3[size][:1], "Gemma3TextConfig", _GEMMA3[size][1])
        for size, variants in (
            ("270m", ("", "-it")),
            ("1b", ("-pt", "-it")),
            ("4b", ("-pt", "-it")),
            ("12b", ("-pt", "-it")),
            ("27b", ("-pt", "-it")),
        )
        for v in variants
    },
    "google/medgemma-4b-pt": ("Gemma3ForConditionalGeneration", "Gemma3TextConfig", _GEMMA3["4b"][1]),
    "google/medgemma-4b-it": ("Gemma3ForConditionalGeneration", "Gemma3TextConfig", _GEMMA3["4b"][1]),
    "google/medgemma-27b-it": ("Gemma3ForConditionalGeneration", "Gemma3TextConfig", _GEMMA3["27b"][1]),
    "google/medgemma-27b-text-it": (
        "Gemma3ForCausalLM",
        "Gemma3TextConfig",
        dict(_GEMMA3["27b"][1], vocab_size=262144),
    ),
}


def official_hf_config(official_name: str) -> Any | None:
    """The HF config of `official_name` (with `architectures` set), or None if it is not listed."""
    entry = OFFICIAL_HF_CONFIGS.get(official_name)
    if entry is None:
        return None
    import transformers

    architecture, config_class, fields = entry
    return getattr(transformers, config_class)(architectures=[architecture], **fields)
