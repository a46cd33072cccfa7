"""Field names, defaults, hook-name templates and messages of `transformer_lens.lit`.

The field names are the keys LIT's specs use for a language model's inputs and outputs.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class InputFields:
    TEXT: str = "text"
    TOKENS: str = "tokens"
    TOKEN_EMBEDDINGS: str = "token_embeddings"
    TARGET: str = "target"
    TARGET_MASK: str = "target_mask"


@dataclass(frozen=True)
class OutputFields:
    TOKENS: str = "tokens"
    TOKEN_IDS: str = "token_ids"
    LOGITS: str = "logits"
    TOP_K_TOKENS: str = "top_k_tokens"
    GENERATED_TEXT: str = "generated_text"
    PROBAS: str = "probas"
    LOSS: str = "loss"
    LAYER_EMB_TEMPLATE: str = "layer_{layer}/embeddings"
    CLS_EMBEDDING: str = "cls_embedding"
    MEAN_EMBEDDING: str = "mean_embedding"
    ATTENTION_TEMPLATE: str = "layer_{layer}/head_{head}/attention"
    LAYER_ATTENTION_TEMPLATE: str = "layer_{layer}/attention"
    TOKEN_GRADIENTS: str = "token_gradients"
    GRAD_DOT_INPUT: str = "grad_dot_input"
    INPUT_EMBEDDINGS: str = "input_embeddings"


@dataclass(frozen=True)
class Defaults:
    MAX_SEQ_LENGTH: int = 512
    BATCH_SIZE: int = 8
    TOP_K: int = 10
    COMPUTE_GRADIENTS: bool = True
    OUTPUT_ATTENTION: bool = True
    OUTPUT_EMBEDDINGS: bool = True
    OUTPUT_ALL_LAYERS: bool = False
    EMBEDDING_LAYERS: tuple | None = None
    PREPEND_BOS: bool = True
    DEVICE: str | None = None


@dataclass(frozen=True)
class HookPoints:
    """Hook names as `HookedTransformer` spells them; `{layer}` is filled per layer."""

    HOOK_EMBED: str = "hook_embed"
    HOOK_POS_EMBED: str = "hook_pos_embed"
    HOOK_TOKENS: str = "hook_tokens"
    RESID_PRE_TEMPLATE: str = "blocks.{layer}.hook_resid_pre"
    RESID_MID_TEMPLATE: str = "blocks.{layer}.hook_resid_mid"
    RESID_POST_TEMPLATE: str = "blocks.{layer}.hook_resid_post"
    ATTN_OUT_TEMPLATE: str = "blocks.{layer}.hook_attn_out"
    ATTN_PATTERN_TEMPLATE: str = "blocks.{layer}.attn.hook_pattern"
    ATTN_SCORES_TEMPLATE: str = "blocks.{layer}.attn.hook_attn_scores"
    Q_TEMPLATE: str = "blocks.{layer}.attn.hook_q"
    K_TEMPLATE: str = "blocks.{layer}.attn.hook_k"
    V_TEMPLATE: str = "blocks.{layer}.attn.hook_v"
    MLP_OUT_TEMPLATE: str = "blocks.{layer}.hook_mlp_out"
    MLP_PRE_TEMPLATE: str = "blocks.{layer}.mlp.hook_pre"
    MLP_POST_TEMPLATE: str = "blocks.{layer}.mlp.hook_post"
    LN_FINAL: str = "ln_final.hook_normalized"


@dataclass(frozen=True)
class Errors:
    NO_TOKENIZER: str = "The model has no tokenizer; LIT needs one to turn text into tokens: pass tokenizer=."
    INVALID_MODEL: str = "Model must be an instance of HookedTransformer. Got: {model_type}"
    LIT_NOT_INSTALLED: str = "The LIT integration needs lit-nlp: pip install lit-nlp"
    INCOMPATIBLE_INPUT: str = "Input example is missing field {field!r}"
    BATCH_SIZE_MISMATCH: str = "Batch size mismatch. Expected {expected}, got {actual}"


@dataclass(frozen=True)
class ServerConfig:
    DEFAULT_PORT: int = 5432
    DEFAULT_HOST: str = "localhost"
    DEFAULT_TITLE: str = "TransformerLens + LIT"
    DEV_MODE: bool = False
    WARM_START: bool = True
    MAX_EXAMPLES: int = 1000


INPUT_FIELDS = InputFields()
OUTPUT_FIELDS = OutputFields()
DEFAULTS = Defaults()
HOOK_POINTS = HookPoints()
ERRORS = Errors()
SERVER_CONFIG = ServerConfig()
