"""Text generation: the KV-cached decoding loop, sampling, the KV caches and the static-cache path.

`HookedTransformer.generate` and `generate_stream` are `loop.generate` and
`loop.generate_stream`; the names below were importable from `hooked.generation` when it was
one module, and still are. `GenerationOptions` holds every option of a call in one validated
object (`generate(model, prompt, options=...)`).
"""

# past `__all__`: the rest of what the one-module `hooked.generation` held or imported, so that
# code importing it from there (`from hooked.generation import StaticKeyValueCache`) keeps working
from hooked.generation.loop import (  # noqa: F401
    RETURN_TYPES,
    USE_DEFAULT_VALUE,
    ActivationCache,
    AtSteps,
    AttentionMaskError,
    DeviceStepGate,
    GenerationHookError,
    GenerationOutput,
    HookedTransformerKeyValueCache,
    InputError,
    Prompt,
    StaticCacheOptions,
    StaticKeyValueCache,
    StaticRecorder,
    check_generate_args,
    check_hook_pairs,
    check_left_padded,
    check_model_input,
    check_names_filter,
    check_token_range,
    decode_step,
    generate,
    generate_stream,
    is_compile_safe,
    logger,
    longrope_switches,
    mask_dtype_check,
    mask_is_all_ones,
    prepare_prompt,
    stitch_attention,
    warn_python_hooks,
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
