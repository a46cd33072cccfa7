"""Text generation: the KV-cached decoding loop, sampling, the KV caches and the static-cache path.

`HookedTransformer.generate` and `generate_stream` are `loop.generate` and
`loop.generate_stream`; the names below were importable from `hooked.generation` when it was
one module, and still are. `GenerationOptions` holds every option of a call in one validated
object (`generate(model, prompt, options=...)`).
"""

# Past `__all__`: the rest of what the one-module `hooked.generation` held or imported, so that
# code importing it from there (`from hooked.generation import StaticKeyValueCache`) keeps working.
from hooked.analysis.activation_cache import ActivationCache  # noqa: F401
from hooked.components.rotary import longrope_switches  # noqa: F401
from hooked.core.errors import AttentionMaskError, GenerationHookError, InputError  # noqa: F401
from hooked.core.utils import USE_DEFAULT_VALUE, AtSteps  # noqa: F401
from hooked.core.validation import (  # noqa: F401
    check_generate_args,
    check_hook_pairs,
    check_model_input,
    check_names_filter,
    check_token_range,
    mask_dtype_check,
    mask_is_all_ones,
)
from hooked.generation.kv_cache import HookedTransformerKeyValueCache, StaticKeyValueCache  # noqa: F401
from hooked.generation.loop import (  # noqa: F401
    GenerationOutput,
    Prompt,
    check_left_padded,
    generate,
    generate_stream,
    logger,
    prepare_prompt,
    stitch_attention,
)
from hooked.generation.options import (
    RETURN_TYPES,  # noqa: F401
    GenerationOptions,
)
from hooked.generation.sampling import (
    apply_freq_penalty,
    apply_repetition_penalty,
    sample_next_token,
    token_counts,
    top_k_filter,
    top_p_filter,
)
from hooked.generation.static_cache import (  # noqa: F401
    DeviceStepGate,
    StaticCacheOptions,
    StaticRecorder,
    decode_step,
    is_compile_safe,
    warn_python_hooks,
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
