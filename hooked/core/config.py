"""`HookedTransformerConfig`: every architectural choice of a model, in one validated dataclass."""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from hooked.core.errors import ConfigError, UnknownConfigFieldError  # noqa: F401  (ConfigError re-exported)

if TYPE_CHECKING:
    from hooked.core.vision_config import VisionLanguageConfig

ACT_FNS = (
    "relu",
    "relu2",
    "gelu",
    "gelu_new",
    "gelu_fast",
    "gelu_bloom",
    "gelu_pytorch_tanh",
    "silu",
    "solu",
    "solu_ln",
    "xielu",
    "quick_gelu",
)
NORMALIZATION_TYPES = ("LN", "LNPre", "RMS", "RMSPre", None)
LAYER_NORM_TYPES = ("LN", "LNPre")  # the kinds that center their input (RMSNorm does not)
#: the token mixers a block can hold (`layer_types`); `mlp` is a block with no token mixer (Nemotron-H)
LAYER_TYPES = ("attention", "mamba", "mamba2", "gated_deltanet", "short_conv", "mlp")
#: the layer types that carry a state from one position to the next besides the residual stream
RECURRENT_LAYER_TYPES = ("mamba", "mamba2", "gated_deltanet", "short_conv")
#: block features a hybrid block (`layer_types`) does not build, so `_check_layer_types` refuses them (with
#: `kv_shared_from` and `activation_sparsity` where they are set)
_NOT_IN_HYBRID_BLOCKS = (
    "post_sublayer_norm",
    "use_normalization_before_and_after",
    "parallel_attn_mlp",
    "altup_num_inputs",
    "laurel_rank",
    "d_per_layer_input",
    "layer_scalar",
)
#: the KV cache stream of DeepSeek sparse attention's indexer keys (`kv_cache_streams`)
INDEXER_KEYS = "indexer_keys"
ROUTER_SCORINGS = ("softmax", "sigmoid", "topk_softmax", "sparsemixer")
POSITIONAL_EMBEDDING_TYPES = ("standard", "shortformer", "rotary", "alibi", "relative_positional_bias")
#: HF classes whose norms sit only after each sublayer: a config naming one is post-norm (`is_post_norm`)
#: even without `post_sublayer_norm` (a TransformerLens config, which has no such field)
POST_NORM_ARCHITECTURES = ("Olmo2ForCausalLM",)


@dataclass
class HookedTransformerConfig:
    """Hyperparameters of a `HookedTransformer` (field names follow TransformerLens).

    The fields are flat (TransformerLens's names, `cfg.x` reads, `to_dict`/`from_dict`, pickles)
    and grouped in sections: **shape** (sizes and block layout), **positions** (rotary, ALiBi,
    relative bias), **attention**, **norms**, **MLP / mixture of experts**, **recurrent layers** (the
    token mixer of each block: state-space and hybrid models), **hook switches**
    (optional hook points), **HF numerics** (knobs that only reorder roundings, so a model in
    half precision matches HuggingFace bit for bit), **runtime** (dtype, device, init, tokenizer),
    **image-text models** (the vision tower of an image-text model), **provenance** (where the weights
    came from) and **accepted for TransformerLens** (read but not used). `__post_init__` fills the
    derived defaults (`n_heads`, `d_mlp`, `d_vocab_out`, `rotary_dim`, `attn_scale`, ...) and raises
    `ConfigError` on inconsistent combinations; facts derived from several fields (`uses_rotary`,
    `has_post_sublayer_norms`, ...) are properties.
    """

    # -- shape: sizes and block layout ---------------------------------------------------------
    d_model: int
    """Width of the residual stream."""
    d_head: int
    """Width of one attention head's query, key and value."""
    n_layers: int
    """Number of transformer blocks."""
    n_ctx: int
    """Longest sequence (positions) the model accepts; the size of a learned position table."""
    n_heads: int = -1
    """Query heads per attention layer; -1: `d_model // d_head`."""
    d_mlp: int | None = None
    """Hidden width of each MLP (of each expert in a MoE layer); None: `4 * d_model` (unless `attn_only`)."""
    d_vocab: int = -1
    """Rows of the token embedding `W_E` (the tokenizer's vocabulary size); -1: unknown."""
    d_vocab_out: int = -1
    """Columns of the unembedding `W_U` (logits per position); -1: `d_vocab`."""
    attn_only: bool = False
    """Blocks without MLPs (attention-only toy models)."""
    parallel_attn_mlp: bool = False
    """Attention and MLP both read the block's input and their outputs are summed (GPT-J, NeoX, Phi, Falcon)."""
    layer_d_head: list[int] | None = None
    """Gemma 4: each layer's head width (its global layers are wider); None: `d_head` everywhere. Each block is built
    from `layer_config(layer)`, which reads this (and the two fields below)."""
    layer_n_key_value_heads: list[int] | None = None
    """Gemma 4: each layer's key/value heads (`num_global_key_value_heads` on global layers); None: `n_key_value_heads`
    everywhere."""
    layer_d_mlp: list[int] | None = None
    """Each layer's MLP width: Gemma 3n's per-layer `intermediate_size`, Gemma 4's double-wide MLPs on its KV-shared
    layers, the dense layers of DeepSeek/GLM mixtures of experts (`dense_mlp_layers`; an expert's width there is the
    layer's entry); None: `d_mlp` everywhere."""
    layer_scalar: bool = False
    """Gemma 4: each block multiplies the residual stream it returns by a learned scalar (`blocks.{l}.layer_scalar`,
    `[1]`): `hook_resid_post` is the scaled stream."""
    d_per_layer_input: int | None = None
    """Gemma 3n/4 per-layer embeddings (PLE): width of the input each layer gets of its own (`per_layer_embed`,
    `blocks.{l}.per_layer`); None: none."""
    d_vocab_per_layer_input: int | None = None
    """Rows of the per-layer embedding table (tokens at or past it read row 0, as Gemma 3n); set with
    `d_per_layer_input`."""
    altup_num_inputs: int | None = None
    """Gemma 3n AltUp: the residual stream is that many streams, `[batch, pos, stream, d_model]`; each block
    runs on stream `altup_active_idx` and corrects the others (`components/altup.py`); None: one stream."""
    altup_active_idx: int = 0
    """Gemma 3n AltUp: the stream the block's sublayers read and the logits come from first."""
    altup_correct_scale: bool = True
    """Gemma 3n AltUp: the corrected active stream is scaled by `altup.correct_output_scale` before it gates the
    per-layer input."""
    laurel_rank: int | None = None
    """Gemma 3n LAuReL: rank of the low-rank linear residual beside each attention (`blocks.{l}.laurel`); None: none."""

    # -- positions -----------------------------------------------------------------------------
    positional_embedding_type: str = "standard"
    """How positions enter: `standard` (learned `W_pos` added to the embedding), `shortformer` (added to q/k
    inputs only), `rotary`, `alibi` or `relative_positional_bias` (T5); see `uses_rotary`."""
    rotary_dim: int | None = None
    """Leading dimensions of each head that rotary embeddings rotate (even, at most `d_head`); None: `d_head`.
    Under multi-head latent attention (`kv_lora_rank`) the rotated dims are the last `rotary_dim`."""
    rotary_base: float = 10000.0
    """Rotary base theta: frequency `i` is `rotary_base ** (-2i / rotary_dim)`."""
    rotary_base_local: float | None = None
    """Rotary base of sliding-window layers when it differs from `rotary_base` (Gemma 3); None: the same."""
    rotary_adjacent_pairs: bool = False
    """Rotate adjacent pairs `(x0, x1), (x2, x3)...` (GPT-J) instead of the two halves (NeoX/LLaMA)."""
    rotary_interleaved_input: bool = False
    """DeepSeek-V3, GLM-MoE-DSA: the rotated dims come as adjacent pairs `(x0, x1), (x2, x3)...` and leave as two
    halves (each pair's first element rotated, then each second), as HF's `apply_rotary_pos_emb_interleave`."""
    nope_layers: list[int] | None = None
    """Layers that use no positional encoding at all (SmolLM3, Cohere2); None: none."""
    rotary_scaling: dict | None = None
    """HF's `rope_scaling` dict (`rope_type` `linear`, `llama3`, `yarn`, `longrope`...); None: plain RoPE."""
    rotary_scaling_local: dict | None = None
    """`rope_scaling` of sliding-window layers when `rotary_base_local` is set; None: unscaled there."""
    alibi_bias_max: float | None = None
    """MPT: ALiBi as MPT computes it (`components/alibi.py`): slopes `2^(-alibi_bias_max * h / n)` and float32 biases
    by key column relative to the last key; None: Bloom's slopes and biases."""
    relative_attention_num_buckets: int | None = None
    """T5 (HookedEncoderDecoder): buckets of the relative position bias table."""
    relative_attention_max_distance: int | None = None
    """T5 (HookedEncoderDecoder): distance beyond which relative positions share the last bucket."""

    # -- attention -----------------------------------------------------------------------------
    n_key_value_heads: int | None = None
    """Key/value heads under grouped-query attention (divides `n_heads`); None (or `n_heads`): one per query
    head; see `uses_grouped_query_attention` and `n_kv_heads`."""
    use_attn_scale: bool = True
    """Scale attention scores by `1 / attn_scale`; False: unscaled (`attn_scale` becomes 1)."""
    attn_scale: float = -1.0
    """Divisor of the attention scores; -1: `sqrt(d_head)`."""
    scale_attn_by_inverse_layer_idx: bool = False
    """GPT-2 option: layer `l`'s scores are further divided by `l + 1`."""
    attention_dir: str = "causal"
    """`causal` (decoders) or `bidirectional` (encoders)."""
    use_local_attn: bool = False
    """Some layers attend within a sliding window; needs `window_size` and `attn_types`."""
    window_size: int | None = None
    """Positions a sliding-window (local) layer sees, itself included."""
    attn_types: list[str] | None = None
    """`"global"` or `"local"` per layer (length `n_layers`) when `use_local_attn`; see `attn_types_or_global`."""
    attn_scores_soft_cap: float = -1.0
    """Gemma 2: scores become `cap * tanh(scores / cap)`; -1: no cap."""
    output_logits_soft_cap: float = -1.0
    """Gemma 2: logits become `cap * tanh(logits / cap)` (kept beside its attention twin); -1: no cap."""
    attn_sinks: bool = False
    """GPT-OSS: one learned logit per head joins each softmax and is then dropped."""
    clip_qkv: float | None = None
    """OLMo: q, k and v clamped to `[-clip_qkv, clip_qkv]` after their projections; None: no clamp."""
    kv_shared_from: list[int | None] | None = None
    """Gemma 3n, Gemma 4: per layer, the earlier layer whose keys and values (rotated, cached ones included) it
    attends to instead of computing its own (it has no `W_K`/`W_V`); None entries (or None): its own."""
    use_v_norm: bool = False
    """Gemma 3n, Gemma 4: each value head is RMS-normalized without a gain (`attn.v_norm`) after `hook_v`."""
    kv_lora_rank: int | None = None
    """Multi-head latent attention (DeepSeek-V2/V3, GLM-MoE-DSA): width of the KV latent, one vector per token from
    which every head's keys (their non-rotary part) and values are up-projected; the KV cache stores it with the
    shared rotary key. None: ordinary attention. See `uses_mla` and components/mla.py."""
    q_lora_rank: int | None = None
    """MLA: width of the query latent the queries are up-projected from; None: queries straight from the residual."""
    d_head_v: int | None = None
    """Width of each head's value and `hook_z` where it differs from `d_head` (MLA's `v_head_dim`); None: `d_head`.
    See `d_value`."""
    index_n_heads: int | None = None
    """DeepSeek sparse attention (GLM-MoE-DSA): heads of the indexer that scores the keys of each query; set with
    `index_d_head` and `index_topk`. None: every query attends to every earlier key. See `uses_sparse_attention`."""
    index_d_head: int | None = None
    """DSA: width of one indexer head (its first `rotary_dim` dims rotate)."""
    index_topk: int | None = None
    """DSA: keys each query attends to, the top-scoring ones by the indexer."""
    index_shared_layers: list[int] | None = None
    """DSA: layers without an indexer of their own, reusing the keys the previous layer selected (GLM's `"shared"`
    `indexer_types`); None: every layer selects its own."""

    # -- norms ---------------------------------------------------------------------------------
    normalization_type: str | None = "LN"
    """`LN` (LayerNorm), `RMS` (RMSNorm), their gain-free `LNPre`/`RMSPre` forms after `fold_ln`, or None."""
    eps: float = 1e-5
    """Epsilon added to the variance (mean square for RMSNorm) of every norm."""
    final_rms: bool = False
    """`ln_final` is an RMSNorm although the blocks use LayerNorm."""
    use_normalization_before_and_after: bool = False
    """Gemma 2/3 "sandwich": besides `ln1`/`ln2`, `ln1_post`/`ln2_post` normalize each sublayer's output."""
    post_sublayer_norm: bool = False
    """OLMo-2/3: `ln1`/`ln2` normalize each sublayer's output and no norm reads the residual stream in a block
    (built as `PostNormBlock`); see `is_post_norm`."""
    post_embedding_ln: bool = False
    """Bloom: a LayerNorm right after the token embedding."""
    use_qk_norm: bool = False
    """Queries and keys are normalized before rotary and the dot product."""
    qk_norm_after_rotary: bool = False
    """HunYuan: the qk-norm normalizes the rotated queries and keys (after `hook_rot_q`/`hook_rot_k`), not their
    projections (needs `use_qk_norm`)."""
    full_width_qk_norm: bool = False
    """OLMo-2/3, OLMoE: the q/k norm spans all heads (`n_heads * d_head`), not one `d_head` (needs `use_qk_norm`)."""
    qk_norm_per_head: bool = False
    """StableLM, Cohere: a separate q/k LayerNorm gain per head (`[head, d_head]`)."""
    # -- MLP and mixture of experts ------------------------------------------------------------
    act_fn: str | None = None
    """MLP activation, one of `ACT_FNS`; required unless `attn_only`."""
    gated_mlp: bool = False
    """Gated (GLU) MLP: `act(x @ W_gate) * (x @ W_in)` (LLaMA's SwiGLU); MoE experts are always gated."""
    num_experts: int | None = None
    """Experts per mixture-of-experts layer; None: dense MLPs. See `uses_moe`."""
    experts_per_token: int | None = None
    """Experts each token is routed to (top-k); set with `num_experts`."""
    norm_topk_prob: bool = False
    """Renormalize the top-k routing weights to sum to 1 (Mixtral, Qwen3-MoE, OLMoE)."""
    shared_expert_d_mlp: int | None = None
    """Hidden width of an always-on shared expert beside the routed ones (Qwen2-MoE, Qwen3-Next, DeepSeek, GLM,
    Granite-hybrid); None: none. See `shared_expert_gate`."""
    shared_expert_gate: bool = True
    """With `shared_expert_d_mlp`: the shared expert's output is scaled by a sigmoid gate `sigmoid(x w_s)` (Qwen2-MoE,
    Qwen3-Next); False: added as is (DeepSeek, GLM, Granite-hybrid)."""
    swiglu_limit: float | None = None
    """GPT-OSS: clamp of the gate (above) and the up projection (both sides) in the experts; None: no clamp."""
    swiglu_alpha: float = 1.702
    """GPT-OSS: the experts' activation is `gate * sigmoid(swiglu_alpha * gate)`."""
    activation_sparsity: list[float] | None = None
    """Gemma 3n: per layer, the fraction of MLP gate activations a Gaussian top-k cuts to zero before the
    activation (0: dense); None: dense everywhere."""
    router_scoring: str = "softmax"
    """How the router turns its logits into expert scores (one of `ROUTER_SCORINGS`): `softmax` over all experts;
    `sigmoid` per expert, the choice read from the scores plus a per-expert selection bias, the buffer
    `mlp.e_score_correction_bias` (DeepSeek-V3, GLM-4-MoE, LFM2-MoE; zeros where the checkpoint has none);
    `topk_softmax`, a softmax over the top-k logits only (GraniteMoE, Granite-hybrid); `sparsemixer`, PhiMoE's two
    masked softmaxes (top-2)."""
    router_groups: int | None = None
    """Group-limited routing (DeepSeek `n_group`): experts form this many equal groups, and each token chooses its
    experts within its `router_topk_groups` best groups (a group scores its best expert under `softmax`, its two
    best under `sigmoid`); None: no groups."""
    router_topk_groups: int | None = None
    """Group-limited routing: groups each token may choose experts from (DeepSeek `topk_group`)."""
    routed_scaling_factor: float = 1.0
    """Sigmoid or grouped routing (DeepSeek, GLM, LFM2-MoE): the routing weights are multiplied by this after any
    renormalization (`norm_topk_prob`)."""
    router_norm_eps: float = 1e-20
    """Sigmoid or grouped routing with `norm_topk_prob`: the chosen scores are divided by their sum plus this (HF's
    DeepSeek, GLM: 1e-20; LFM2-MoE: 1e-6)."""
    sparsemixer_jitter_eps: float = 0.01
    """PhiMoE (`router_scoring="sparsemixer"`): an expert stays in a selection's softmax while its logit is within
    `2 * eps` (relative to the larger magnitude) of that selection's best (`router_jitter_noise`)."""
    dense_mlp_layers: list[int] | None = None
    """Layers of a mixture-of-experts model whose MLP is a dense gated MLP (DeepSeek's `first_k_dense_replace`,
    GLM's `mlp_layer_types`, LFM2-MoE's `num_dense_layers`), as wide as `layer_d_mlp` says; None: every layer is a
    mixture of experts. See `is_moe_layer`."""

    # -- recurrent layers: state-space and hybrid models (Mamba, Mamba-2, gated DeltaNet, LFM2) ------
    layer_types: list[str] | None = None
    """The token mixer of each block (length `n_layers`), one of `LAYER_TYPES`: `attention`, `mamba` (Mamba's
    selective scan), `mamba2` (Mamba-2's SSD), `gated_deltanet` (Qwen3-Next, Qwen3.5), `short_conv` (LFM2), or
    `mlp` (a block with an MLP and no token mixer, Nemotron-H); None: attention in every block. A hybrid model
    is this list; see `recurrent_layers` and `attention_layers`. A longer list is cut to `n_layers` (loading
    `first_n_layers`)."""
    single_sublayer_blocks: bool = False
    """Each block holds one sublayer: its token mixer, or for `mlp` layers its MLP (Mamba, Mamba-2, Nemotron-H);
    False: a token mixer, then an MLP, as in a transformer block."""
    ssm_d_state: int | None = None
    """Mamba, Mamba-2: the state width N each channel carries (HF's `state_size`)."""
    ssm_d_inner: int | None = None
    """Mamba, Mamba-2: channels of the scan (Mamba: `expand * d_model`; Mamba-2: `ssm_n_heads * ssm_d_head`)."""
    ssm_n_heads: int | None = None
    """Mamba-2: heads of the scan, each with one scalar decay per position."""
    ssm_n_groups: int = 1
    """Mamba-2: groups of heads sharing one B and one C (and one group of the gated norm)."""
    ssm_dt_rank: int | None = None
    """Mamba: width of the low-rank step-size projection (`x_proj` -> dt, then `dt_proj`)."""
    ssm_conv_kernel: int = 4
    """Width of the depthwise causal convolution before the scan (Mamba, Mamba-2, gated DeltaNet, LFM2)."""
    ssm_chunk_size: int = 256
    """Mamba-2: positions per chunk of the SSD scan (HF's `chunk_size`; only the rounding depends on it)."""
    ssm_dt_limit: tuple[float, float | None] | list[float | None] = (0.0, None)
    """Mamba-2: the step size is clamped to `[low, high]` after the softplus (HF's `time_step_limit`); a high of
    None: no upper bound (HF's `inf`, kept out of the config so that it stays valid JSON); a list (from JSON) becomes
    a tuple."""
    ssm_act_fn: str = "silu"
    """Activation after the causal convolution of Mamba, Mamba-2 and gated DeltaNet layers."""
    deltanet_n_key_heads: int | None = None
    """Gated DeltaNet: query/key heads (each serves `deltanet_n_value_heads // deltanet_n_key_heads` value heads)."""
    deltanet_n_value_heads: int | None = None
    """Gated DeltaNet: value heads, each with its own `[d_key_head, d_value_head]` state, decay and beta."""
    deltanet_d_key_head: int | None = None
    """Gated DeltaNet: width of one query/key head."""
    deltanet_d_value_head: int | None = None
    """Gated DeltaNet: width of one value head."""
    attn_output_gate: bool = False
    """Qwen3-Next, Qwen3.5: `W_Q` also yields a per-head gate; `z * sigmoid(gate)` is what `W_O` reads."""

    # -- hook switches: optional hook points (TransformerLens's flags), off by default for speed ---
    use_attn_result: bool = False
    """Compute `hook_result`, each head's output `[batch, pos, head, d_model]` (memory: `n_heads` x `d_model`)."""
    use_split_qkv_input: bool = False
    """Give each head its own q/k/v input (`hook_q_input`, `hook_k_input`, `hook_v_input`, `[batch, pos, head,
    d_model]`)."""
    use_attn_in: bool = False
    """One per-head attention input `hook_attn_in` `[batch, pos, head, d_model]`; not with grouped-query attention."""
    use_hook_mlp_in: bool = False
    """Add `hook_mlp_in`, the MLP's input before its norm."""
    use_hook_tokens: bool = False
    """Add `hook_tokens`, the token ids the model is run on."""
    ungroup_grouped_query_attention: bool = False
    """Expand grouped K/V to `n_heads` before `hook_k`/`hook_v`, so hooks see one K/V per query head."""

    # -- HF numerics: reorder roundings so half precision matches HuggingFace bit for bit -----------
    # each is exact in float32 (the maths is the same); the loaders set the ones their family needs
    parallel_residual_last: bool = False
    """A parallel block sums `(attn_out + mlp_out) + resid_pre`, as HF's NeoX/Phi/GPT-J/Falcon."""
    bias_after_matmul: bool = False
    """Falcon's FalconLinear: `x @ W + b` as two ops (two roundings below fp32)."""
    attn_scale_divides: bool = False
    """Falcon: scores / attn_scale (not * 1/attn_scale), as HF."""
    alibi_before_attn_scale: bool = False
    """Falcon: the ALiBi bias is added before the scaling, `(q.k + bias) / attn_scale` (slopes pre-scaled)."""
    attn_scores_in_fp32: bool = False
    """GPT-J, GPT-Neo: HF multiplies q and k in float32 in half precision (`hook_attn_scores` is float32)."""
    rotary_in_fp32: bool = False
    """Cohere, OLMo: q/k rotated in float32, then cast back (as HF)."""
    rotary_tables_in_fp32: bool = False
    """OLMo: cos/sin stay float32 (Cohere rounds them to the dtype first)."""
    norm_gain_in_fp32: bool = False
    """OLMo-2, Cohere: the norm gain multiplies the float32 normalized input before the cast, `(n32 * w).to(dtype)`."""
    norm_gain_fp32_in_float16: bool = False
    """GPT-OSS: HF keeps its norm weights float32 in float16 models."""
    norm_gain_offset: float = 0.0
    """Gemma's 1: HF's gain is `1 + w` (in float32); `ln*.w` holds the sum (float32 in half precision)."""
    per_layer_scales_in_dtype: bool = False
    """Gemma 3n: the per-layer input scales (`d_model^-1/2`, `2^-1/2`) are rounded to the model dtype before they
    multiply (Gemma 4 multiplies by the exact values)."""
    moe_mix_in_fp32: bool = False
    """Mixtral: expert outputs times float32 routing weights, cast after the sum."""
    router_in_fp32: bool = False
    """DeepSeek, GLM: the router's weight stays float32 in every dtype and its logits are computed in float32 (HF's
    `_keep_in_fp32_modules_strict`); it picks its top-k unsorted, as HF."""

    # -- runtime: dtype, device, initialization, attention kernel, tokenization ------------------
    dtype: torch.dtype = torch.float32
    """Parameter and activation dtype (a string such as `"bfloat16"` is accepted)."""
    device: str | None = None
    """Device the model is built on; None: the default device."""
    n_devices: int = 1
    """TransformerLens's layer split across devices; hooked uses 1 (`hooked.scale` places models instead)."""
    attn_implementation: str = "auto"
    """`auto`: PyTorch's fused `scaled_dot_product_attention` while no attention hook needs the pattern; `eager`:
    always the explicit softmax."""
    init_weights: bool = True
    """Randomly initialize the weights when the model is built (False when a checkpoint overwrites them)."""
    init_mode: str = "gpt2"
    """Initialization scheme; only `gpt2` changes the `initializer_range` default."""
    initializer_range: float = -1.0
    """Std of the normal weight init; -1: `0.8 / sqrt(d_model)` for `init_mode="gpt2"`, else 1."""
    seed: int | None = None
    """Seed torch before initializing weights; None: leave the global RNG as is."""
    default_prepend_bos: bool = True
    """Whether text inputs get a BOS token when the call does not say (`prepend_bos=None`)."""
    tokenizer_name: str | None = None
    """Tokenizer (HF name or path) loaded when the model is built without one; None: no tokenizer."""
    tokenizer_prepends_bos: bool | None = None
    """Set from the tokenizer: whether it adds BOS itself; None: no tokenizer yet."""
    decoder_start_token_id: int | None = None
    """T5 (HookedEncoderDecoder): the decoder's first token; None: the tokenizer's pad token."""

    # -- image-text models ----------------------------------------------------------------------
    vision_language: VisionLanguageConfig | None = None
    """Image-text models (LLaVA, Gemma 3 with images): the vision tower, the projector and where image features
    enter the text (a `hooked.core.vision_config.VisionLanguageConfig`, or a dict of its fields); None: text only.
    The other fields describe the language model."""

    # -- provenance: where the config and weights came from --------------------------------------
    model_name: str = "custom"
    """The checkpoint's name (HF repo id or alias); `custom` for a config built by hand."""
    original_architecture: str | None = None
    """HF architecture class the weights were converted from (`LlamaForCausalLM`...); None: built by hand."""
    weight_processing: tuple = ()
    """Weight-processing steps already applied (`fold_ln`, `center_writing_weights`...), in order."""
    from_checkpoint: bool = False
    """Loaded from an intermediate training checkpoint (not the final weights)."""
    checkpoint_index: int | None = None
    """Index of that checkpoint in the model's checkpoint list."""
    checkpoint_label_type: str | None = None
    """What `checkpoint_value` counts (`step`; TransformerLens also has `tokens`)."""
    checkpoint_value: int | None = None
    """The training step (or tokens seen) of that checkpoint."""
    embed_scale: float | None = None
    """Granite: embedding multiplier the converter folded into `W_E` (informational); None: 1."""
    residual_scale: float | None = None
    """Granite: residual multiplier folded into every sublayer's output weights (informational); None: 1."""
    logit_scale: float | None = None
    """Granite: `1 / logits_scaling`, folded into `W_U` (informational); None: 1."""
    n_params: int = field(init=False, default=0)
    """Derived: weights in the attention and MLP matrices (TransformerLens's count: no embeddings, norms, biases)."""

    # -- accepted for TransformerLens: fields of TL's config that hooked takes but does not use --------
    tie_word_embeddings: bool = False
    """Decoder-only models read tying from the checkpoint; only HookedEncoderDecoder (T5) reads this."""
    trust_remote_code: bool = False
    """Ignored: hooked never runs checkpoint code."""
    load_in_4bit: bool = False
    """Must stay False: quantized weights are out of hooked's scope (True raises)."""

    def __post_init__(self) -> None:
        """Fill the defaults that depend on other fields, then refuse inconsistent fields (named steps, in order)."""
        if self.load_in_4bit:
            raise NotImplementedError("load_in_4bit: quantized weights are out of hooked's scope; load in fp32/bf16")
        if isinstance(self.dtype, str):
            from hooked.core.validation import to_dtype

            self.dtype = to_dtype(self.dtype)
        if self.n_heads == -1:
            if self.d_model % self.d_head:
                raise ConfigError(f"n_heads=-1 needs d_head ({self.d_head}) to divide d_model ({self.d_model})")
            self.n_heads = self.d_model // self.d_head
        self._check_layer_types()
        self._fill_mlp_and_check_names()
        self._fill_attention_sizes()
        self._fill_attention_scale_and_check_modes()
        self._check_experts()
        self._check_mla_and_routing()
        self._check_layer_shapes()
        self._fill_derived_fields()
        self.n_params = self._count_params()

    def _fill_mlp_and_check_names(self) -> None:
        """`d_mlp` defaults to 4 * d_model where a block has an MLP; activation, norm and position names are known."""
        if any(self.block_has_mlp(layer) for layer in range(self.n_layers)):
            if self.d_mlp is None:
                self.d_mlp = 4 * self.d_model
            if self.act_fn is None:
                raise ConfigError("act_fn is required unless attn_only=True (or no block has an MLP)")
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

    def _fill_attention_sizes(self) -> None:
        """Default the unembedding width and rotary dims; key/value heads divide the query heads."""
        if self.d_vocab_out == -1:
            self.d_vocab_out = self.d_vocab
        if self.rotary_dim is None:
            self.rotary_dim = self.d_head
        if self.uses_rotary and (self.rotary_dim % 2 or self.rotary_dim > self.d_head):
            raise ConfigError(f"rotary_dim ({self.rotary_dim}) must be even and at most d_head ({self.d_head})")
        if self.n_key_value_heads is not None and self.n_heads % self.n_key_value_heads:
            raise ConfigError(f"n_key_value_heads ({self.n_key_value_heads}) must divide n_heads ({self.n_heads})")
        if self.n_key_value_heads == self.n_heads:
            self.n_key_value_heads = None  # plain multi-head attention
        if self.use_attn_in and self.uses_grouped_query_attention:
            raise ConfigError("use_attn_in is not supported with grouped-query attention (n_key_value_heads)")

    def _fill_attention_scale_and_check_modes(self) -> None:
        """The score scale (sqrt(d_head) unless given or turned off); direction, implementation, local windows."""
        if self.use_attn_scale and self.attn_scale == -1.0:
            self.attn_scale = math.sqrt(self.d_head)
        if not self.use_attn_scale:
            self.attn_scale = 1.0
        if self.attention_dir not in ("causal", "bidirectional"):
            raise ConfigError(f"attention_dir must be 'causal' or 'bidirectional', got {self.attention_dir!r}")
        if self.attn_implementation not in ("auto", "eager"):
            raise ConfigError(f"attn_implementation must be 'auto' or 'eager', got {self.attn_implementation!r}")
        attn_types = self.attn_types
        local_attn_ready = self.window_size is not None and attn_types is not None and len(attn_types) == self.n_layers
        if self.use_local_attn and not local_attn_ready:
            raise ConfigError("use_local_attn needs window_size and attn_types (one 'global'/'local' per layer)")

    def _check_experts(self) -> None:
        """Mixture-of-experts fields come together, on gated MLPs; qk-norm over the full width needs qk-norm."""
        if (self.num_experts is None) != (self.experts_per_token is None):
            raise ConfigError("num_experts and experts_per_token must be set together")
        if self.num_experts is not None and not self.gated_mlp:
            raise ConfigError("mixture-of-experts layers are gated (SwiGLU experts): set gated_mlp=True")
        if self.qk_norm_after_rotary and not self.use_qk_norm:
            raise ConfigError("qk_norm_after_rotary (the qk-norm after rotary, HunYuan) needs use_qk_norm=True")
        if self.full_width_qk_norm and not self.use_qk_norm:
            raise ConfigError("full_width_qk_norm (qk-norm over n_heads * d_head) needs use_qk_norm=True")
        self._check_per_layer_fields()
        if self.shared_expert_d_mlp is not None and self.num_experts is None:
            raise ConfigError("shared_expert_d_mlp needs num_experts (it is the always-on expert of a MoE layer)")

    def _fill_derived_fields(self) -> None:
        """The init scale, and the fields JSON reads back as other types (lists, dicts) in their own types."""
        if self.initializer_range < 0:
            self.initializer_range = 0.8 / math.sqrt(self.d_model) if self.init_mode == "gpt2" else 1.0
        self.weight_processing = tuple(self.weight_processing)
        low, high = self.ssm_dt_limit  # a tuple whether built here or read back from JSON (a list)
        self.ssm_dt_limit = (float(low or 0.0), None if high is None or math.isinf(high) else float(high))
        if isinstance(self.vision_language, dict):
            from hooked.core.vision_config import VisionLanguageConfig

            self.vision_language = VisionLanguageConfig.from_dict(self.vision_language)

    def _check_per_layer_fields(self) -> None:
        """Per-layer lists have one entry per layer; per-layer inputs name their table."""
        for name in ("layer_d_head", "layer_n_key_value_heads", "layer_d_mlp", "kv_shared_from", "activation_sparsity"):
            values = getattr(self, name)
            if values is not None and len(values) != self.n_layers:
                raise ConfigError(
                    f"{name} has {len(values)} entries; it needs one per layer (n_layers={self.n_layers})"
                )
        for layer, source in enumerate(self.kv_shared_from or ()):
            if source is not None and not 0 <= source < layer:
                raise ConfigError(f"kv_shared_from[{layer}] = {source}: a layer reuses the keys of an earlier layer")
        if (self.d_per_layer_input is None) != (self.d_vocab_per_layer_input is None):
            raise ConfigError("d_per_layer_input and d_vocab_per_layer_input are set together (the per-layer table)")

    def _check_layer_shapes(self) -> None:
        """Each layer's own widths (`layer_config`) pass the checks the model's widths pass; KV sharing is usable."""
        for layer in range(self.n_layers):
            cfg = self.layer_config(layer)
            if cfg.n_key_value_heads is not None and self.n_heads % cfg.n_key_value_heads:
                raise ConfigError(
                    f"layer_n_key_value_heads[{layer}] = {cfg.n_key_value_heads} must divide n_heads ({self.n_heads})"
                )
            rotary = cfg.rotary_dim
            assert rotary is not None  # _fill_attention_sizes fills it
            if cfg.uses_rotary and (rotary % 2 or rotary > cfg.d_head):
                raise ConfigError(
                    f"layer {layer}: rotary_dim ({rotary}) must be even and at most its d_head ({cfg.d_head}); "
                    "set layer_d_head to even widths of at least rotary_dim"
                )
        self._check_kv_sharing()

    def _check_kv_sharing(self) -> None:
        """A layer in `kv_shared_from` borrows from a layer that computes its own keys, of the same shape, on plain
        attention: a borrowing layer is `SharedKVAttention`, which has neither MLA's latents nor an output gate."""
        borrowers = [layer for layer in range(self.n_layers) if self.kv_source(layer) is not None]
        if borrowers and (self.uses_mla or self.attn_output_gate):
            kind = "kv_lora_rank (multi-head latent attention)" if self.uses_mla else "attn_output_gate"
            raise ConfigError(f"kv_shared_from (KV sharing across layers) is not supported with {kind}")
        for layer in borrowers:
            source = self.kv_source(layer)
            assert source is not None  # a borrower
            if self.kv_source(source) is not None:
                raise ConfigError(
                    f"kv_shared_from[{layer}] = {source}, a layer that borrows its own keys: name the layer that "
                    f"computes them (kv_shared_from[{source}] = {self.kv_source(source)})"
                )
            mine, theirs = self.layer_config(layer), self.layer_config(source)
            if (mine.n_kv_heads, mine.d_head) != (theirs.n_kv_heads, theirs.d_head):
                raise ConfigError(
                    f"kv_shared_from[{layer}] = {source}: layer {layer} has {mine.n_kv_heads} key/value heads of width "
                    f"{mine.d_head}, layer {source} {theirs.n_kv_heads} of width {theirs.d_head}; a layer borrows the "
                    "keys of a layer of its own shape (layer_d_head, layer_n_key_value_heads)"
                )

    def _check_layer_types(self) -> None:
        """`layer_types` names a known mixer per layer, and each recurrent mixer has its sizes."""
        if self.layer_types is None:
            if self.single_sublayer_blocks:
                raise ConfigError("single_sublayer_blocks needs layer_types (which sublayer each block holds)")
            return
        self.layer_types = list(self.layer_types)[: self.n_layers]  # `first_n_layers` keeps the first types
        unknown = sorted(set(self.layer_types) - set(LAYER_TYPES))
        if len(self.layer_types) != self.n_layers or unknown:
            raise ConfigError(
                f"layer_types must name one of {LAYER_TYPES} for each of the {self.n_layers} layers, got "
                f"{self.layer_types!r}"
            )
        self._refuse_what_hybrid_blocks_lack()
        if "mlp" in self.layer_types and not self.single_sublayer_blocks:
            raise ConfigError("an 'mlp' layer (a block with no token mixer) needs single_sublayer_blocks=True")
        self._check_mixer_sizes()

    def _refuse_what_hybrid_blocks_lack(self) -> None:
        """Hybrid blocks have no parallel or post-sublayer norms, no KV sharing and no activation sparsity."""
        unsupported = [f for f in _NOT_IN_HYBRID_BLOCKS if getattr(self, f)]
        if any(source is not None for source in self.kv_shared_from or ()):
            unsupported.append("kv_shared_from")
        if any(self.activation_sparsity or ()):
            unsupported.append("activation_sparsity")
        if unsupported:
            raise ConfigError(f"layer_types (hybrid blocks) do not support {', '.join(unsupported)}")

    def _check_mixer_sizes(self) -> None:
        """Each recurrent mixer named in `layer_types` has its sizes, and Mamba-2's heads and groups divide."""
        assert self.layer_types is not None
        needs = {
            "mamba": ("ssm_d_state", "ssm_d_inner", "ssm_dt_rank"),
            "mamba2": ("ssm_d_state", "ssm_d_inner", "ssm_n_heads"),
            "gated_deltanet": (
                "deltanet_n_key_heads", "deltanet_n_value_heads", "deltanet_d_key_head", "deltanet_d_value_head"
            ),
        }  # fmt: skip
        for kind, fields in needs.items():
            missing = [f for f in fields if kind in self.layer_types and getattr(self, f) is None]
            if missing:
                raise ConfigError(f"{kind} layers need {', '.join(missing)}")
        if "mamba2" in self.layer_types:
            heads, inner = self.ssm_n_heads or 1, self.ssm_d_inner or 0
            if inner % heads or heads % self.ssm_n_groups:
                raise ConfigError("mamba2: ssm_n_heads must divide ssm_d_inner, and ssm_n_groups ssm_n_heads")

    def _check_mla_and_routing(self) -> None:
        """Refuse inconsistent multi-head latent attention, sparse attention and routing fields."""
        if self.router_scoring not in ROUTER_SCORINGS:
            raise ConfigError(f"router_scoring must be one of {ROUTER_SCORINGS}, got {self.router_scoring!r}")
        if (self.router_groups is None) != (self.router_topk_groups is None):
            raise ConfigError("router_groups and router_topk_groups must be set together (group-limited routing)")
        if self.router_scoring in ("topk_softmax", "sparsemixer") and self.routed_scaling_factor != 1.0:
            raise ConfigError(f"routed_scaling_factor scales softmax and sigmoid routing, not {self.router_scoring}")
        if self.router_groups is not None and (self.num_experts or 0) % self.router_groups:
            raise ConfigError(f"router_groups ({self.router_groups}) must divide num_experts ({self.num_experts})")
        if self.dense_mlp_layers is not None and self.num_experts is None:
            raise ConfigError(
                "dense_mlp_layers needs num_experts: it names the dense layers of a mixture-of-experts model"
            )
        if self.uses_mla and not (self.uses_rotary and self.rotary_dim is not None and self.rotary_dim < self.d_head):
            raise ConfigError(
                "multi-head latent attention (kv_lora_rank) needs rotary positions on the last rotary_dim dims of "
                f"each head, with rotary_dim below d_head (got rotary_dim={self.rotary_dim}, d_head={self.d_head})"
            )
        if self.uses_mla and self.attn_output_gate:
            raise ConfigError("attn_output_gate (an output-gated attention) is not supported with kv_lora_rank (MLA)")
        if 0 in (self.index_shared_layers or ()):
            raise ConfigError("index_shared_layers cannot hold layer 0: a shared layer reuses the layer before's keys")
        index = (self.index_n_heads, self.index_d_head, self.index_topk)
        if any(x is not None for x in index) and (None in index or self.q_lora_rank is None or not self.uses_mla):
            raise ConfigError(
                "sparse attention needs index_n_heads, index_d_head and index_topk together, on multi-head latent "
                "attention with a query latent (kv_lora_rank and q_lora_rank): the indexer reads the query latent"
            )

    # -- derived facts: each defined once, here; code asks these instead of re-testing the fields ----
    @property
    def uses_mla(self) -> bool:
        """Attention is multi-head latent attention (`kv_lora_rank` set): keys and values come from one latent."""
        return self.kv_lora_rank is not None

    @property
    def uses_sparse_attention(self) -> bool:
        """DeepSeek sparse attention: an indexer picks the `index_topk` keys each query attends to."""
        return self.index_topk is not None

    @property
    def d_value(self) -> int:
        """Width of each head's value, `hook_z` and `W_O` input: `d_head_v`, else `d_head`."""
        return self.d_head_v or self.d_head

    def kv_cache_entry_shape(self, layer: int) -> tuple[int, int, int]:
        """`(heads, key width, value width)` of one cached position of layer `layer` (its `layer_config`).

        Ordinary attention caches each K/V head's key and value, at the layer's own head count and
        width (Gemma 4's global layers are wider). MLA caches one "head": its key slot holds the KV
        latent (`kv_lora_rank`) and its value slot the shared rotary key (`rotary_dim`), from which
        every head's keys and values are recomputed.
        """
        cfg = self.layer_config(layer)
        if cfg.uses_mla:
            assert cfg.kv_lora_rank is not None and cfg.rotary_dim is not None  # uses_mla; __post_init__ fills
            return 1, cfg.kv_lora_rank, cfg.rotary_dim
        heads = cfg.n_heads if cfg.ungroup_grouped_query_attention else cfg.n_kv_heads
        return heads, cfg.d_head, cfg.d_head

    @property
    def kv_cache_streams(self) -> dict[str, int]:
        """Per-position tensors each layer caches besides keys and values, by name and width (DSA's indexer keys)."""
        if not self.uses_sparse_attention:
            return {}
        assert self.index_d_head is not None  # __post_init__ sets the index fields together
        return {INDEXER_KEYS: self.index_d_head}

    def is_moe_layer(self, layer: int) -> bool:
        """Whether `layer`'s MLP is a mixture of experts (not one of `dense_mlp_layers`)."""
        return self.uses_moe and layer not in (self.dense_mlp_layers or ())

    @property
    def mixer_types(self) -> list[str]:
        """The token mixer of every block: `layer_types`, or `attention` for each block without them."""
        return list(self.layer_types) if self.layer_types is not None else ["attention"] * self.n_layers

    @property
    def attention_layers(self) -> list[int]:
        """The blocks whose token mixer is attention (every block of a transformer; some of a hybrid)."""
        return [layer for layer, kind in enumerate(self.mixer_types) if kind == "attention"]

    @property
    def recurrent_layers(self) -> list[int]:
        """The blocks whose token mixer carries a state across positions (`RECURRENT_LAYER_TYPES`):
        a generation cache holds their convolution and recurrent states instead of keys and values."""
        return [layer for layer, kind in enumerate(self.mixer_types) if kind in RECURRENT_LAYER_TYPES]

    def block_has_mixer(self, layer: int) -> bool:
        """Whether block `layer` has a token mixer (attention or recurrent); Nemotron-H's `mlp` blocks have none."""
        return self.mixer_types[layer] != "mlp"

    def block_has_mlp(self, layer: int) -> bool:
        """Whether block `layer` has an MLP: not with `attn_only`; in single-sublayer blocks, only `mlp` layers."""
        if self.attn_only:
            return False
        return self.mixer_types[layer] == "mlp" if self.single_sublayer_blocks else True

    def block_writes(self, layer: int) -> tuple[str, ...]:
        """The hook names (without `hook_`) of what block `layer` adds to the residual stream, in order:
        `attn_out` (attention), `mixer_out` (any other token mixer), `mlp_out`."""
        writes = []
        if self.block_has_mixer(layer):
            writes.append("attn_out" if self.mixer_types[layer] == "attention" else "mixer_out")
        if self.block_has_mlp(layer):
            writes.append("mlp_out")
        return tuple(writes)

    @property
    def n_kv_heads(self) -> int:
        """Key/value heads as stored (`n_heads` without grouped-query attention)."""
        return self.n_key_value_heads or self.n_heads

    @property
    def uses_grouped_query_attention(self) -> bool:
        """K/V heads are shared by groups of query heads (`n_key_value_heads` set and below `n_heads`).

        Such models store K/V at `n_key_value_heads` under `_W_K`, `_b_K`, `_W_V`, `_b_V`.
        """
        return self.n_key_value_heads is not None

    @property
    def uses_rotary(self) -> bool:
        """Positions are rotary embeddings of q and k (layers in `nope_layers` still rotate nothing)."""
        return self.positional_embedding_type == "rotary"

    @property
    def uses_moe(self) -> bool:
        """The MLPs are mixture-of-experts layers (`num_experts` routed experts)."""
        return bool(self.num_experts)

    @property
    def uses_layer_norm(self) -> bool:
        """The block norms are LayerNorms (`LN`/`LNPre`), which center their input; RMSNorm does not."""
        return self.normalization_type in LAYER_NORM_TYPES

    @property
    def is_post_norm(self) -> bool:
        """Norms only after each sublayer (OLMo-2/3): nothing inside a block reads a normalized residual stream.

        True with `post_sublayer_norm` or an `original_architecture` in `POST_NORM_ARCHITECTURES`;
        `fold_ln` and `center_writing_weights` then do not apply.
        """
        return self.post_sublayer_norm or self.original_architecture in POST_NORM_ARCHITECTURES

    @property
    def has_post_sublayer_norms(self) -> bool:
        """Each sublayer's output is normalized before the residual add (Gemma 2/3's sandwich, OLMo-2/3).

        Then a layer's write is no plain sum of per-head or per-neuron terms.
        """
        return self.use_normalization_before_and_after or self.is_post_norm

    @property
    def attn_types_or_global(self) -> list[str]:
        """`attn_types`, or `"global"` for every layer without local attention."""
        if not self.use_local_attn:
            return ["global"] * self.n_layers
        assert self.attn_types is not None  # __post_init__ refuses use_local_attn without attn_types
        return self.attn_types

    @property
    def residual_is_sum_of_sublayers(self) -> bool:
        """The residual stream is the embedding plus what every attention and MLP wrote: not in Gemma 3n/4, whose
        per-layer inputs, layer scalars, AltUp streams and LAuReL also write or scale it."""
        return not (self.d_per_layer_input or self.layer_scalar or self.uses_altup or self.laurel_rank)

    def kv_source(self, layer: int) -> int | None:
        """The earlier layer whose keys and values layer `layer` attends to (`kv_shared_from`); None: its own."""
        return None if self.kv_shared_from is None else self.kv_shared_from[layer]

    def lends_kv(self, layer: int) -> bool:
        """Whether a later layer attends to layer `layer`'s keys and values."""
        return layer in (self.kv_shared_from or ())

    @property
    def uses_altup(self) -> bool:
        """The residual stream is `altup_num_inputs` streams, `[batch, pos, stream, d_model]` (Gemma 3n)."""
        return bool(self.altup_num_inputs)

    def layer_config(self, layer: int) -> HookedTransformerConfig:
        """The config layer `layer`'s modules are built from: `self`, or a view with the layer's own head width,
        K/V heads and MLP width (`layer_d_head`, `layer_n_key_value_heads`, `layer_d_mlp`) that reads every other
        field from `self` as it is now (switches flipped at run time included)."""
        overrides = self._layer_overrides(layer)
        return LayerConfig(self, overrides) if overrides else self

    def _layer_overrides(self, layer: int) -> dict[str, Any]:
        overrides: dict[str, Any] = {}
        if self.layer_d_head is not None and self.layer_d_head[layer] != self.d_head:
            overrides["d_head"] = self.layer_d_head[layer]
            if self.rotary_dim == self.d_head:  # full rotary stays full
                overrides["rotary_dim"] = self.layer_d_head[layer]
        if self.layer_n_key_value_heads is not None:
            kv_heads = self.layer_n_key_value_heads[layer]
            kv_heads = None if kv_heads == self.n_heads else kv_heads  # plain multi-head attention
            if kv_heads != self.n_key_value_heads:
                overrides["n_key_value_heads"] = kv_heads
        if self.layer_d_mlp is not None and self.layer_d_mlp[layer] != self.d_mlp:
            overrides["d_mlp"] = self.layer_d_mlp[layer]
        return overrides

    @property
    def mlp_width(self) -> int:
        """`d_mlp` as an int: `__post_init__` fills it in for every model with MLP layers."""
        if self.d_mlp is None:
            raise ConfigError("this config has no MLP layers (attn_only=True), so no d_mlp")
        return self.d_mlp

    def _count_params(self) -> int:
        n, per_mlp = 0, self.d_model * (2 + int(self.gated_mlp))
        attention = set(self.attention_layers)  # a hybrid's recurrent mixers are not counted (TransformerLens's count)
        for layer in range(self.n_layers):
            layer_cfg = self.layer_config(layer)  # the layer's own widths (Gemma 3n/4, the dense layers of a MoE)
            if layer in attention:
                n += layer_cfg._attention_params()
            if self.block_has_mlp(layer):
                experts = (self.num_experts or 1) if self.is_moe_layer(layer) else 1
                n += per_mlp * layer_cfg.mlp_width * experts
        return n

    def _attention_params(self) -> int:
        """Weights of one attention layer's matrices (MLA: its low-rank factors)."""
        d, H, dh = self.d_model, self.n_heads, self.d_head
        if not self.uses_mla:
            return 4 * d * dh * H
        assert self.kv_lora_rank is not None and self.rotary_dim is not None
        q_in = self.q_lora_rank or d
        q = H * q_in * dh + (d * self.q_lora_rank if self.q_lora_rank else 0)
        kv = d * (self.kv_lora_rank + self.rotary_dim) + H * self.kv_lora_rank * (dh - self.rotary_dim + self.d_value)
        return q + kv + H * self.d_value * d

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


class LayerConfig(HookedTransformerConfig):
    """One layer's view of a model's config (`HookedTransformerConfig.layer_config`).

    The per-layer shape fields come from `overrides`; every other field is read from the model's
    config on each access, and writes go to it, so a switch flipped on `model.cfg` (`use_attn_result`,
    `attn_implementation`, ...) reaches every layer. Properties (`n_kv_heads`, ...) see the overrides.
    Each field is a plain Python property (`_view_field`), which `torch.compile` traces.
    """

    def __init__(self, base: HookedTransformerConfig, overrides: dict[str, Any]):  # no dataclass __init__: a view
        self.__dict__["_base"] = base
        self.__dict__["_overrides"] = dict(overrides)

    def layer_config(self, layer: int) -> HookedTransformerConfig:
        return self.__dict__["_base"].layer_config(layer)


def _view_field(name: str) -> property:
    """`LayerConfig.<name>`: the layer's override, else the model config's current value; writes go to the model's."""

    def get(self: LayerConfig) -> Any:
        overrides = self.__dict__["_overrides"]
        return overrides[name] if name in overrides else getattr(self.__dict__["_base"], name)

    def set_(self: LayerConfig, value: Any) -> None:
        setattr(self.__dict__["_base"], name, value)

    return property(get, set_)


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
for _field in dataclasses.fields(HookedTransformerConfig):
    setattr(LayerConfig, _field.name, _view_field(_field.name))
