"""SmolLM3 (`SmolLM3ForCausalLM`): LLaMA's layout with NoPE layers.

`no_rope_layers[l]` is 1 where layer l uses rotary and 0 where it uses no position
encoding at all (every 4th layer by default): those become `cfg.nope_layers`. Sliding
windows follow `layer_types` when `use_sliding_window`. Weights are LLaMA's.
"""

from __future__ import annotations

from typing import Any

from hooked.loading.llama import convert_llama_weights, llama_shaped_config, local_attention, qwen_local_layers
from hooked.loading.registry import register_architecture


def convert_smollm3_config(hf: Any) -> dict:
    window = hf.sliding_window if getattr(hf, "use_sliding_window", False) else None
    return dict(
        llama_shaped_config(hf, "SmolLM3ForCausalLM"),
        nope_layers=[layer for layer, use_rope in enumerate(hf.no_rope_layers) if not use_rope],
        **local_attention(window, qwen_local_layers(hf)),
        default_prepend_bos=False,
    )


register_architecture(("SmolLM3ForCausalLM",), convert_smollm3_config, convert_llama_weights)
