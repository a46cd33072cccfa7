"""`HookedTransformerConfig`: every architectural choice of a model, in one validated dataclass."""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
from dataclasses import dataclass, field
from typing import Any

import torch

from hooked.core.errors import ConfigError, UnknownConfigFieldError  # noqa: F401  (ConfigError re-exported)

ACT_FNS = (
    "relu",
    "gelu",
    "gelu_new",
    "gelu_fast",
    "gelu_bloom",
    "gelu_pytorch_tanh",
    "silu",
    "solu",
    "solu_ln",
    "xielu",
)
NORMALIZATION_TYPES = ("LN", "LNPre", "RMS", "RMSPre", None)
POSITIONAL_EMBEDDING_TYPES = ("standard", "shortformer", "rotary", "alibi", "relative_positional_bias")


@dataclass
class HookedTransformerConfig:
    """Hyperparameters of a `HookedTransformer` (field names follow TransformerLens).

    Derived defaults are filled in `__post_init__` (`n_heads`, `d_mlp`, `d_vocab_out`,
    `rotary_dim`, `attn_scale`, ...), and inconsistent combinations raise `ConfigError`.
    """

    d_model: int
    d_head: int
    n_layers: int
    n_ctx: int
    n_heads: int = -1
    d_mlp: int | None = None
    d_vocab: int = -1
    d_vocab_out: int = -1
    act_fn: str | None = None
    eps: float = 1e-5
    normalization_type: str | None = "LN"
    final_rms: bool = False
    positional_embedding_type: str = "standard"
    rotary_dim: int | None = None
    rotary_base: float = 10000.0
    rotary_base_local: float | None = None
    rotary_adjacent_pairs: bool = False
    nope_layers: list[int] | None = None
    rotary_scaling: dict | None = None
    rotary_scaling_local: dict | None = None
    n_key_value_heads: int | None = None
    ungroup_grouped_query_attention: bool = False
    attn_only: bool = False
    parallel_attn_mlp: bool = False
    parallel_residual_last: bool = False  # parallel block sums (attn_out + mlp_out) + resid_pre, as HF's NeoX/Phi
    gated_mlp: bool = False
    num_experts: int | None = None
    experts_per_token: int | None = None
    norm_topk_prob: bool = False
    moe_mix_in_fp32: bool = False  # Mixtral: expert outputs times float32 routing weights, cast after the sum
    shared_expert_d_mlp: int | None = None
    swiglu_limit: float | None = None
    swiglu_alpha: float = 1.702
    use_attn_scale: bool = True
    attn_scale: float = -1.0
    scale_attn_by_inverse_layer_idx: bool = False
    attention_dir: str = "causal"
    use_local_attn: bool = False
    window_size: int | None = None
    attn_types: list[str] | None = None
    attn_scores_soft_cap: float = -1.0
    output_logits_soft_cap: float = -1.0
    use_qk_norm: bool = False
    attn_sinks: bool = False
    alibi_before_attn_scale: bool = False
    bias_after_matmul: bool = False  # Falcon's FalconLinear: `x @ W + b` as two ops (two roundings below fp32)
    attn_scale_divides: bool = False  # Falcon: scores / attn_scale (not * 1/attn_scale), as HF
    attn_scores_in_fp32: bool = False  # GPT-J, GPT-Neo: HF multiplies q and k in float32 in half precision
    rotary_in_fp32: bool = False  # Cohere, OLMo: q/k rotated in float32, then cast back (as HF)
    rotary_tables_in_fp32: bool = False  # OLMo: cos/sin stay float32 (Cohere rounds them to the dtype first)
    full_width_qk_norm: bool = False
    norm_gain_in_fp32: bool = False
    norm_gain_fp32_in_float16: bool = False  # GPT-OSS: HF keeps its norm weights float32 in float16 models
    norm_gain_offset: float = 0.0  # Gemma's 1: HF's gain is `1 + w` (in float32); `ln*.w` holds the sum
    qk_norm_per_head: bool = False
    use_normalization_before_and_after: bool = False
    post_sublayer_norm: bool = False
    post_embedding_ln: bool = False
    embed_scale: float | None = None
    residual_scale: float | None = None
    logit_scale: float | None = None
    clip_qkv: float | None = None
    use_attn_result: bool = False
    use_split_qkv_input: bool = False
    use_attn_in: bool = False
    use_hook_mlp_in: bool = False
    use_hook_tokens: bool = False
    attn_implementation: str = "auto"
    default_prepend_bos: bool = True
    tokenizer_name: str | None = None
    tokenizer_prepends_bos: bool | None = None
    dtype: torch.dtype = torch.float32
    device: str | None = None
    n_devices: int = 1
    init_mode: str = "gpt2"
    initializer_range: float = -1.0
    init_weights: bool = True
    seed: int | None = None
    original_architecture: str | None = None
    model_name: str = "custom"
    from_checkpoint: bool = False
    checkpoint_index: int | None = None
    checkpoint_label_type: str | None = None
    checkpoint_value: int | None = None
    weight_processing: tuple = ()
    # accepted for TransformerLens compatibility; hooked reads tying and remote code from the checkpoint
    tie_word_embeddings: bool = False
    trust_remote_code: bool = False
    load_in_4bit: bool = False
    # T5 (HookedEncoderDecoder): the relative position bias table and the decoder's first token
    relative_attention_num_buckets: int | None = None
    relative_attention_max_distance: int | None = None
    decoder_start_token_id: int | None = None
    n_params: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        if self.load_in_4bit:
            raise NotImplementedError("load_in_4bit: quantized weights are out of hooked's scope; load in fp32/bf16")
        if isinstance(self.dtype, str):
            from hooked.core.validation import to_dtype

            self.dtype = to_dtype(self.dtype)
        if self.n_heads == -1:
            if self.d_model % self.d_head:
                raise ConfigError(f"n_heads=-1 needs d_head ({self.d_head}) to divide d_model ({self.d_model})")
            self.n_heads = self.d_model // self.d_head
        if not self.attn_only:
            if self.d_mlp is None:
                self.d_mlp = 4 * self.d_model
            if self.act_fn is None:
                raise ConfigError("act_fn is required unless attn_only=True")
        if self.act_fn is not None and self.act_fn not in ACT_FNS:
            raise ConfigError(f"Unknown act_fn {self.act_fn!r}; supported: {', '.join(ACT_FNS)}")
        if self.normalization_type not in NORMALIZATION_TYPES:
            raise ConfigError(
                f"normalization_type must be one of {NORMALIZATION_TYPES}, got {self.normalization_type!r}"
            )
        if self.positional_embedding_type not in POSITIONAL_EMBEDDING_TYPES:
            raise ConfigError(
                f"positional_embedding_type must be one of {POSITIONAL_EMBEDDING_TYPES}, "
                f"got {self.positional_embedding_type!r}"
            )
        if self.d_vocab_out == -1:
            self.d_vocab_out = self.d_vocab
        if self.rotary_dim is None:
            self.rotary_dim = self.d_head
        if self.positional_embedding_type == "rotary" and (self.rotary_dim % 2 or self.rotary_dim > self.d_head):
            raise ConfigError(f"rotary_dim ({self.rotary_dim}) must be even and at most d_head ({self.d_head})")
        if self.n_key_value_heads is not None and self.n_heads % self.n_key_value_heads:
            raise ConfigError(f"n_key_value_heads ({self.n_key_value_heads}) must divide n_heads ({self.n_heads})")
        if self.n_key_value_heads == self.n_heads:
            self.n_key_value_heads = None  # plain multi-head attention
        if self.use_attn_in and self.n_key_value_heads is not None:
            raise ConfigError("use_attn_in is not supported with grouped-query attention (n_key_value_heads)")
        if self.use_attn_scale and self.attn_scale == -1.0:
            self.attn_scale = math.sqrt(self.d_head)
        if not self.use_attn_scale:
            self.attn_scale = 1.0
        if self.attention_dir not in ("causal", "bidirectional"):
            raise ConfigError(f"attention_dir must be 'causal' or 'bidirectional', got {self.attention_dir!r}")
        if self.attn_implementation not in ("auto", "eager"):
            raise ConfigError(f"attn_implementation must be 'auto' or 'eager', got {self.attn_implementation!r}")
        if self.use_local_attn:
            if self.window_size is None or self.attn_types is None or len(self.attn_types) != self.n_layers:
                raise ConfigError("use_local_attn needs window_size and attn_types (one 'global'/'local' per layer)")
        if (self.num_experts is None) != (self.experts_per_token is None):
            raise ConfigError("num_experts and experts_per_token must be set together")
        if self.num_experts is not None and not self.gated_mlp:
            raise ConfigError("mixture-of-experts layers are gated (SwiGLU experts): set gated_mlp=True")
        if self.full_width_qk_norm and not self.use_qk_norm:
            raise ConfigError("full_width_qk_norm (qk-norm over n_heads * d_head) needs use_qk_norm=True")
        if self.shared_expert_d_mlp is not None and self.num_experts is None:
            raise ConfigError("shared_expert_d_mlp needs num_experts (it is the always-on expert of a MoE layer)")
        if self.initializer_range < 0:
            self.initializer_range = 0.8 / math.sqrt(self.d_model) if self.init_mode == "gpt2" else 1.0
        self.weight_processing = tuple(self.weight_processing)
        self.n_params = self._count_params()

    @property
    def n_kv_heads(self) -> int:
        """Key/value heads as stored (`n_heads` without grouped-query attention)."""
        return self.n_key_value_heads or self.n_heads

    @property
    def attn_types_or_global(self) -> list[str]:
        return self.attn_types if self.use_local_attn else ["global"] * self.n_layers

    def _count_params(self) -> int:
        n = self.n_layers * 4 * self.d_model * self.d_head * self.n_heads
        if not self.attn_only:
            mlp = self.d_model * self.d_mlp * (2 + int(self.gated_mlp))
            n += self.n_layers * mlp * (self.num_experts or 1)
        return n

    def is_layer_norm_activation(self) -> bool:
        """True for activations followed by a LayerNorm inside the MLP (`solu_ln`)."""
        return self.act_fn is not None and self.act_fn.endswith("_ln")

    def set_seed_everywhere(self, seed: int) -> None:
        """Seed torch, numpy and random (TransformerLens's helper)."""
        import random

        import numpy as np

        torch.manual_seed(seed)
        np.random.seed(seed)
        random.seed(seed)

    # -- (de)serialisation -------------------------------------------------------
    @classmethod
    def unwrap(cls, config: HookedTransformerConfig | dict) -> HookedTransformerConfig:
        return cls.from_dict(config) if isinstance(config, dict) else config

    @classmethod
    def from_dict(cls, config_dict: dict[str, Any]) -> HookedTransformerConfig:
        """Build from a dict, accepting TransformerLens's rotary-scaling field names."""
        d = dict(config_dict)
        d.pop("n_params", None)
        legacy = {k: d.pop(k) for k in list(d) if k.startswith("NTK_") or k in ("use_NTK_by_parts_rope",)}
        factor = d.pop("rotary_scaling_factor", None)
        if legacy.get("use_NTK_by_parts_rope") and d.get("rotary_scaling") is None:
            d["rotary_scaling"] = {
                "rope_type": "llama3",
                "factor": legacy.get("NTK_by_parts_factor", 8.0),
                "low_freq_factor": legacy.get("NTK_by_parts_low_freq_factor", 1.0),
                "high_freq_factor": legacy.get("NTK_by_parts_high_freq_factor", 4.0),
                "original_max_position_embeddings": legacy.get("NTK_original_ctx_len", 8192),
            }
        elif factor not in (None, 1.0) and d.get("rotary_scaling") is None:
            d["rotary_scaling"] = {"rope_type": "linear", "factor": factor}
        check_config_fields(d)
        return cls(**d)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def replace(self, **changes) -> HookedTransformerConfig:
        d = self.to_dict()
        d.update(changes)
        return HookedTransformerConfig.from_dict(d)


def _field_names() -> list[str]:
    return [f.name for f in dataclasses.fields(HookedTransformerConfig) if f.init]


def check_config_fields(kwargs: dict[str, Any]) -> None:
    """Raise `ConfigError` naming each unknown field and its closest real one (`normalisation_type`...)."""
    known = _field_names()
    unknown = [k for k in kwargs if k not in known]
    if not unknown:
        return
    hints = []
    for name in unknown:
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
        hints.append(f"{name!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    raise UnknownConfigFieldError(
        f"Unknown HookedTransformerConfig field(s): {', '.join(hints)}. "
        "HookedTransformerConfig's dataclass fields list the valid names."
    )


def _init_with_field_check(init):
    """Wrap the dataclass `__init__` so a misspelt keyword names its close match instead of a bare TypeError."""

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        check_config_fields(kwargs)
        init(self, *args, **kwargs)

    return __init__


HookedTransformerConfig.__init__ = _init_with_field_check(HookedTransformerConfig.__init__)
