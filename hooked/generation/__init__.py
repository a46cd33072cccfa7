"""Text generation: the KV-cached decoding loop, sampling, the KV caches and the static-cache path.

`HookedTransformer.generate` and `generate_stream` are `loop.generate` and
`loop.generate_stream`; the names below were importable from `hooked.generation` when it was
one module, and still are. `GenerationOptions` holds every option of a call in one validated
object (`generate(model, prompt, options=...)`).
"""

from hooked.generation.loop import (
    RETURN_TYPES,
    GenerationOutput,
    Prompt,
    check_left_padded,
    generate,
    generate_stream,
    prepare_prompt,
    stitch_attention,
)
from hooked.generation.options import GenerationOptions
from hooked.generation.sampling import (
    apply_freq_penalty,
    apply_repetition_penalty,
    sample_next_token,
    token_counts,
    top_k_filter,
    top_p_filter,
)

__all__ = [
    "RETURN_TYPES",
    "GenerationOptions",
    "GenerationOutput",
    "Prompt",
    "apply_freq_penalty",
    "apply_repetition_penalty",
    "check_left_padded",
    "generate",
    "generate_stream",
    "prepare_prompt",
    "sample_next_token",
    "stitch_attention",
    "token_counts",
    "top_k_filter",
    "top_p_filter",
]
