"""Every tiny random model the tests build, one section per kind (tests/README.md#fixtures).

All are built from configs in memory (no download) with a fixed seed, so a test and its HF
reference see the same weights bit for bit. HF initialises Linear weights with std 0.02,
norm gains at 1 and biases at 0; at that scale attention is nearly uniform and masking,
rotary or grouping bugs barely move the logits. So the factories below redraw every
parameter: q/k projections (and MoE routers) N(0, 0.25²), so attention and routing are far
from uniform, every other matrix and bias N(0, 0.1²), which keeps the residual stream O(1),
norm gains 1 + N(0, 0.2²). (With N(0, 0.25²) everywhere the residual reaches |x| ~ 30 and
float32 rounding alone, with the same math done in a different order, exceeds 1e-5.)

Sections: a corpus and tokenizers; GPT-2 and `hooked_from` (the hooked twin of any HF model);
decoder families by HF class prefix (`tiny_hf`), the LLaMA family, Gemma, Gemma 3n/4, mixtures of experts,
latent attention and routed experts (DeepSeek, GLM, PhiMoE, GraniteMoE), the classic families
(NeoX, GPT-J, OPT, BLOOM, ...); encoders (BERT, DistilBERT, T5, HuBERT); image-text models
(LLaVA, LLaVA-NeXT, LLaVA-OneVision, Gemma 3, Qwen2.5-VL: `tiny_vlm`);
hooked models built from a `HookedTransformerConfig` alone (`tiny_hooked`); `EVERY_FAMILY`,
one builder per decoder family for sweeps. Changing a number here changes what every
parity test compares: add a new entry rather than edit one.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable

import torch

# -- corpus, tokenizers, inputs ----------------------------------------------------------

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "When Mary and John went to the store, John gave a drink to Mary.",
    "The Eiffel Tower is in the city of Paris.",
    "The capital of France is Paris, and the capital of Italy is Rome.",
    "Hooks let you read and rewrite every activation of a transformer.",
]

#: vocabulary of every tiny HF model except the classic families (CLASSIC_VOCAB)
VOCAB = 96


def make_tokenizer(prepends_bos: bool = False, vocab_size: int = 300):
    """A byte-level BPE tokenizer trained on a few sentences; optionally adds BOS like LLaMA's."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<s>", "<pad>"]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(CORPUS, trainer)
    if prepends_bos:
        bos_id = tok.token_to_id("<s>")
        tok.post_processor = processors.TemplateProcessing(
            single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos_id)]
        )
        return PreTrainedTokenizerFast(
            tokenizer_object=tok, bos_token="<s>", eos_token="<|endoftext|>", pad_token="<pad>"
        )
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>")


def tokens(batch=2, pos=12, seed=0):
    """Random token ids below VOCAB, reproducible from `seed`."""
    return torch.randint(0, VOCAB, (batch, pos), generator=torch.Generator().manual_seed(seed))


# -- GPT-2 and the hooked twin of an HF model -------------------------------------------

#: from_pretrained options that keep the weights as HF has them (TransformerLens processes by default)
NO_PROCESSING = dict(fold_ln=False, center_writing_weights=False, center_unembed=False, fold_value_biases=False)


def tiny_gpt2(seed: int = 0, **overrides):
    """A random HF GPT-2 (eager attention) with small dimensions; overrides go to GPT2Config."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    kwargs = dict(n_layer=2, n_embd=64, n_head=4, vocab_size=1000, n_positions=128, attn_implementation="eager")
    kwargs.update(overrides)
    config = GPT2Config(**kwargs)
    hf = GPT2LMHeadModel(config).eval()
    with torch.no_grad():  # random biases and norm parameters, so the parity test exercises them
        for name, p in hf.named_parameters():
            if name.endswith("bias") or "ln" in name:
                p.add_(torch.randn_like(p) * 0.1)
    return hf


def hooked_from(hf, tokenizer=None, **kwargs):
    """The HookedTransformer of the HF model `hf`, unprocessed unless `kwargs` asks (see NO_PROCESSING)."""
    from hooked import HookedTransformer

    options = dict(NO_PROCESSING)
    options.update(kwargs)
    return HookedTransformer.from_pretrained("gpt2", hf_model=hf, tokenizer=tokenizer, **options)


# -- decoder families by HF class prefix --------------------------------------------------


def tiny_hf(prefix: str, seed: int = 0, **overrides):
    """A random 2-layer `{prefix}ForCausalLM` (eager attention), d_model 32, 4 heads.

    Parameters redrawn as in the module docstring (MoE routers sharp as q/k). Special tokens
    are set inside the tiny vocabulary.
    """
    import transformers

    kwargs = dict(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        vocab_size=VOCAB,
        max_position_embeddings=64,
        num_attention_heads=4,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    kwargs.update(copy.deepcopy(overrides))  # HF fills defaults into rope dicts in place
    kwargs.setdefault("attn_implementation", "eager")
    torch.manual_seed(seed)
    config = getattr(transformers, prefix + "Config")(**kwargs)
    hf = getattr(transformers, prefix + "ForCausalLM")(config).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if ("norm" in name or ".ln_" in name) and not name.endswith("bias"):
                p.copy_(1 + 0.2 * torch.randn_like(p))
            else:
                sharp = ("q_proj.weight", "k_proj.weight", "qkv_proj.weight", "query_key_value.weight", "gate.weight")
                sharp = name.endswith(sharp)
                p.normal_(0.0, 0.25 if sharp else 0.1)
    return hf


# -- the LLaMA family (Llama, Mistral, Qwen2, Qwen3) --------------------------------------


def llama_family_classes(family: str):
    """HF's config and model classes of `family` ("llama", "mistral", "qwen2" or "qwen3")."""
    import transformers

    prefix = {"llama": "Llama", "mistral": "Mistral", "qwen2": "Qwen2", "qwen3": "Qwen3"}[family]
    return getattr(transformers, prefix + "Config"), getattr(transformers, prefix + "ForCausalLM")


def tiny_llama_family(family: str, seed: int = 0, **overrides):
    """A random 2-layer HF model of `family` (eager attention), every parameter redrawn (module docstring)."""
    config_cls, model_cls = llama_family_classes(family)
    kwargs = dict(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, vocab_size=VOCAB, max_position_embeddings=64
    )
    kwargs.update(copy.deepcopy(overrides))  # HF fills defaults into rope dicts in place
    torch.manual_seed(seed)
    hf = model_cls(config_cls(**kwargs, attn_implementation="eager")).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.2 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.25 if name.endswith(("q_proj.weight", "k_proj.weight")) else 0.1)
    return hf


# -- Gemma 1, 2 and 3 ---------------------------------------------------------------------

GEMMA_EOS = 1
GEMMA3_ROPE = {
    "sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
    "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 5000.0},
}
SANDWICH = dict(sliding_window=4, query_pre_attn_scalar=24)  # window 4 < 12 positions; 24 != head_dim 16

#: name -> (HF family, config overrides). d_model 32, L = 2, head_dim 16 != 32 / 4.
GEMMA_CONFIGS = {
    "gemma1_mqa_tied": ("gemma", dict(num_key_value_heads=1)),
    "gemma1_mha_untied": ("gemma", dict(num_key_value_heads=4, tie_word_embeddings=False)),
    "gemma2_softcaps_window": (
        "gemma2",
        dict(SANDWICH, attn_logit_softcapping=4.0, final_logit_softcapping=3.0),
    ),
    "gemma3_mixed_rope": (
        "gemma3",
        dict(SANDWICH, layer_types=["sliding_attention", "full_attention"], rope_parameters=GEMMA3_ROPE),
    ),
    "gemma3_image_text_tower": (
        "gemma3_mm",
        dict(SANDWICH, layer_types=["full_attention", "sliding_attention"], rope_parameters=GEMMA3_ROPE),
    ),
}


def _gemma_hf(family: str, overrides: dict):
    import transformers as tf

    text = dict(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, vocab_size=VOCAB, max_position_embeddings=64,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, eos_token_id=GEMMA_EOS, pad_token_id=0,
        bos_token_id=2,
    )  # fmt: skip
    text.update(copy.deepcopy(overrides))  # HF fills defaults into rope dicts in place
    if family == "gemma3_mm":
        vision = dict(
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            image_size=28,
            patch_size=14,
        )
        config = tf.Gemma3Config(
            text_config=text, vision_config=vision, mm_tokens_per_image=4, image_token_index=VOCAB - 1,
            boi_token_index=VOCAB - 3, eoi_token_index=VOCAB - 2, attn_implementation="eager",
        )  # fmt: skip
        return tf.Gemma3ForConditionalGeneration(config)
    config_cls, model_cls = {
        "gemma": (tf.GemmaConfig, tf.GemmaForCausalLM),
        "gemma2": (tf.Gemma2Config, tf.Gemma2ForCausalLM),
        "gemma3": (tf.Gemma3TextConfig, tf.Gemma3ForCausalLM),
    }[family]
    return model_cls(config_cls(**text, attn_implementation="eager"))


def tiny_gemma(name: str, seed: int = 0, **changes):
    """The random HF model of `GEMMA_CONFIGS[name]` (eager attention, `changes` applied), every parameter redrawn.

    Gemma's norm weights `w` are drawn around 0 so every gain `1 + w` differs from 1 (HF
    initialises `w` at 0, where a lost `+ 1` or an unfolded gain would not show).
    """
    family, overrides = GEMMA_CONFIGS[name]
    torch.manual_seed(seed)
    hf = _gemma_hf(family, {**overrides, **changes}).eval()
    with torch.no_grad():
        for pname, p in hf.named_parameters():
            if "norm" in pname:
                p.copy_(0.3 * torch.randn_like(p))  # gain 1 + w
            else:
                p.normal_(0.0, 0.25 if pname.endswith(("q_proj.weight", "k_proj.weight")) else 0.1)
    return hf


def gemma_layers(hf):
    """The decoder layers of a tiny Gemma (of the text tower for the image-text model)."""
    inner = hf.model.language_model if hasattr(hf.model, "language_model") else hf.model
    return inner.layers


# -- Gemma 3n and Gemma 4 (per-layer inputs, KV sharing; 3n's AltUp) ---------------------

_PLE_LAYER_TYPES = ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]
#: 4 layers (sliding, global, sliding, global), the last 2 reusing the keys and values of the first 2
#: (Gemma 3n: the first 3, the last reusing layer 0's: AltUp's 4 streams grow the residual, and with it
#: float32 rounding, faster);
#: head_dim 8 (global layers 16 in Gemma 4), window 4 < 12 positions, per-layer inputs of width 8
_PLE_BASE = dict(
    hidden_size=32, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
    vocab_size=VOCAB, hidden_size_per_layer_input=8, max_position_embeddings=64, sliding_window=4,
    layer_types=_PLE_LAYER_TYPES, num_kv_shared_layers=2, final_logit_softcapping=3.0,
    pad_token_id=0, bos_token_id=2, eos_token_id=GEMMA_EOS,
)  # fmt: skip
_GEMMA4 = dict(_PLE_BASE, intermediate_size=64, global_head_dim=16, vocab_size_per_layer_input=VOCAB)
#: name -> (HF family, config overrides)
GEMMA_PLE_CONFIGS = {
    # global layers 16 wide with proportional rotary on a quarter of their frequencies
    "gemma4_kv_shared_ple": ("gemma4", _GEMMA4),
    # global layers: one K/V head whose values are its keys' projection; double-wide MLPs on the sharing layers
    "gemma4_k_eq_v_double_wide": (
        "gemma4",
        dict(_GEMMA4, attention_k_eq_v=True, num_global_key_value_heads=1, use_double_wide_mlp=True),
    ),
    # the text tower of the image-text model (a one-layer vision tower beside it)
    "gemma4_image_text_tower": ("gemma4_mm", _GEMMA4),
    # AltUp (4 streams), LAuReL rank 4, sparse gates on layers 0 and 1, per-layer MLP widths, a per-layer
    # table shorter than the vocabulary (ids past it read row 0); 3 layers, the last reusing layer 0's keys
    "gemma3n_altup_laurel_sparse": (
        "gemma3n",
        dict(
            _PLE_BASE, num_hidden_layers=3, layer_types=_PLE_LAYER_TYPES[:3], num_kv_shared_layers=1,
            intermediate_size=[64, 48, 64], vocab_size_per_layer_input=VOCAB - 6, laurel_rank=4,
            activation_sparsity_pattern=[0.75, 0.5, 0.0], altup_num_inputs=4,
        ),
    ),
}  # fmt: skip


def _gemma_ple_hf(family: str, overrides: dict):
    import transformers as tf

    if family == "gemma4_mm":
        vision = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, head_dim=8)
        config = tf.Gemma4Config(
            text_config=overrides, vision_config=vision, audio_config=None, image_token_id=VOCAB - 1,
            attn_implementation="eager",
        )  # fmt: skip
        return tf.Gemma4ForConditionalGeneration(config)
    config_cls, model_cls = {
        "gemma4": (tf.Gemma4TextConfig, tf.Gemma4ForCausalLM),
        "gemma3n": (tf.Gemma3nTextConfig, tf.Gemma3nForCausalLM),
    }[family]
    return model_cls(config_cls(**overrides, attn_implementation="eager"))


def tiny_gemma_ple(name: str, seed: int = 0, **changes):
    """The random HF model of `GEMMA_PLE_CONFIGS[name]` (eager attention, `changes` applied), every parameter redrawn.

    Gemma 3n/4 norms multiply by `w` itself: gains drawn around 1 (`1 + N(0, 0.2²)`), as AltUp's output
    scale, except the q/k-norms' (`0.5 + N(0, 0.1²)`: the scores are the unscaled product of two
    normalized vectors, so these gains give them a standard deviation near 1, as Gemma 3's scaled
    scores; gains near 1 make attention so sharp that float32 rounding, in SDPA's order, grows past
    1e-5 within 4 layers); each `layer_scalar` (a buffer) is drawn in [0.5, 1), never the identity.
    """
    family, overrides = GEMMA_PLE_CONFIGS[name]
    torch.manual_seed(seed)
    hf = _gemma_ple_hf(family, copy.deepcopy({**overrides, **changes})).eval()
    with torch.no_grad():
        for pname, p in hf.named_parameters():
            if pname.endswith(("q_norm.weight", "k_norm.weight")):  # scores are q.k unscaled: gains below 1 keep
                p.copy_(0.5 + 0.1 * torch.randn_like(p))  # scores of std ~1, as Gemma 3 scaled by its scalar
            elif "norm" in pname or pname.endswith("correct_output_scale"):
                p.copy_(1 + 0.2 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.25 if pname.endswith(("q_proj.weight", "k_proj.weight")) else 0.1)
        for pname, b in hf.named_buffers():
            if pname.endswith("layer_scalar"):
                b.copy_(0.5 + 0.5 * torch.rand_like(b))
    return hf


# -- mixtures of experts ------------------------------------------------------------------

MOE = dict(num_experts=4, num_experts_per_tok=2)

#: name -> (HF class prefix, config overrides): 4 experts, top-2 routing
MOE_CONFIGS = {
    "mixtral": ("Mixtral", dict(num_local_experts=4, num_experts_per_tok=2, num_key_value_heads=2)),
    "qwen2_moe_shared_expert": (
        "Qwen2Moe",
        dict(MOE, moe_intermediate_size=48, shared_expert_intermediate_size=40, num_key_value_heads=2),
    ),
    "qwen3_moe_norm_topk": (
        "Qwen3Moe",
        dict(MOE, moe_intermediate_size=48, norm_topk_prob=True, head_dim=16, num_key_value_heads=1),
    ),
    "olmoe_clip_qkv": ("Olmoe", dict(MOE, clip_qkv=0.5, norm_topk_prob=False, num_key_value_heads=4)),
    # router bias, top-k then softmax, biased experts with a clamped SwiGLU that clamps (limit 0.5),
    # attention sinks, alternating sliding window (4), YaRN
    "gpt_oss_sinks_clamped_swiglu": (
        "GptOss",
        dict(
            num_local_experts=4,
            num_experts_per_tok=2,
            num_key_value_heads=2,
            head_dim=8,
            sliding_window=4,
            swiglu_limit=0.5,
            rope_parameters=dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=8, rope_theta=1e4),
        ),
    ),
}


def tiny_moe(prefix: str, seed: int = 0, **overrides):
    """`tiny_hf` for a mixture-of-experts class (the router is redrawn sharp, as q/k)."""
    return tiny_hf(prefix, seed, **overrides)


# -- latent attention and routed experts (issue 37) -------------------------------------
# d_model 32, 4 heads; MLA with a query latent of 24, a KV latent of 16, heads of 8 + 4 rotary dims
# and values of 6 (every width differs, so a swapped factor shows); expert widths are multiples of
# 8 (HF's half-precision grouped_mm needs 16-byte strides). Routers, q/k up-projections and DeepSeek's
# score-correction bias (a buffer, which the generic redraw skips) are redrawn too.

GRANITE_MULTIPLIERS = dict(
    embedding_multiplier=3.0,
    attention_multiplier=0.3,
    residual_multiplier=0.5,
    logits_scaling=4.0,
    num_key_value_heads=2,
)
MLA = dict(
    q_lora_rank=24, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=6, num_key_value_heads=4,
    moe_intermediate_size=24, n_shared_experts=1, first_k_dense_replace=1,
)  # fmt: skip
YARN_MSCALE = dict(
    rope_type="yarn", factor=4.0, original_max_position_embeddings=16, mscale=0.8, mscale_all_dim=0.9, rope_theta=1e4
)

#: name -> (HF class prefix, config overrides)
ROUTED_CONFIGS = {
    # V2: softmax router, group-limited (2 groups of 2, one kept), routed scaling, a dense first layer
    "deepseek_v2_group_limited": (
        "DeepseekV2",
        dict(
            MLA,
            n_routed_experts=4,
            num_experts_per_tok=2,
            topk_method="group_limited_greedy",
            n_group=2,
            topk_group=1,
            routed_scaling_factor=1.5,
        ),
    ),
    # V2-Lite: no query latent, greedy top-k, YaRN with its attention-scale factor
    "deepseek_v2_lite_yarn": (
        "DeepseekV2",
        dict(
            MLA,
            q_lora_rank=None,
            n_routed_experts=4,
            num_experts_per_tok=2,
            topk_method="greedy",
            rope_parameters=YARN_MSCALE,
        ),
    ),
    # V3: sigmoid router with correction bias, 4 groups of 2 (2 kept), interleaved rotary, YaRN, a dense first layer
    "deepseek_v3_group_limited": (
        "DeepseekV3",
        dict(
            MLA,
            n_routed_experts=8,
            num_experts_per_tok=2,
            n_group=4,
            topk_group=2,
            routed_scaling_factor=2.5,
            rope_parameters=YARN_MSCALE,
        ),
    ),
    # DSA: 4 of up to 12 keys per query; layer 1 shares layer 0's selection; a dense first layer; 8 indexer
    # heads, so a key's score is rarely an exact tie at 0 (the ReLU of every head's product)
    "glm_moe_dsa_topk4": (
        "GlmMoeDsa",
        dict(
            MLA,
            num_hidden_layers=3,
            n_routed_experts=4,
            num_experts_per_tok=2,
            index_topk=4,
            index_head_dim=8,
            index_n_heads=8,
            mlp_layer_types=["dense", "sparse", "sparse"],
            indexer_types=["full", "shared", "full"],
        ),
    ),
    # GLM-4-MoE: rotary on half of each head, per-head qk-norm, q/k/v biases, 2 groups (1 kept)
    "glm4_moe_qk_norm_groups": (
        "Glm4Moe",
        dict(
            num_key_value_heads=2,
            n_routed_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=24,
            first_k_dense_replace=1,
            use_qk_norm=True,
            n_group=2,
            topk_group=1,
            attention_bias=True,
            routed_scaling_factor=1.5,
        ),
    ),
    # PhiMoE: LayerNorms, sparsemixer, a sliding window shorter than the sequence, an lm_head bias
    "phimoe_sparsemixer": (
        "Phimoe",
        dict(
            num_key_value_heads=2,
            num_local_experts=4,
            num_experts_per_tok=2,
            sliding_window=6,
            attention_bias=True,
            lm_head_bias=True,
        ),
    ),
    # GraniteMoE: Granite's multipliers (powers of two where they scale a sum, so folding them is exact)
    "granitemoe_multipliers": ("GraniteMoe", dict(GRANITE_MULTIPLIERS, num_local_experts=4, num_experts_per_tok=2)),
}


def tiny_routed(name: str, seed: int = 0, **changes):
    """The random HF model of `ROUTED_CONFIGS[name]` (`changes` applied), every parameter and router bias redrawn."""
    prefix, overrides = ROUTED_CONFIGS[name]
    hf = tiny_hf(prefix, seed, **{**overrides, **changes})
    sharp = ("q_b_proj.weight", "kv_b_proj.weight", "router.weight", "wq_b.weight", "wk.weight")
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for pname, p in hf.named_parameters():
            if pname.endswith(sharp):
                p.copy_(0.25 * torch.randn(p.shape, generator=generator))
        for bname, b in hf.named_buffers():
            if bname.endswith("e_score_correction_bias"):
                b.copy_(0.1 * torch.randn(b.shape, generator=generator))
    return hf


# -- classic families (issue 13) ----------------------------------------------------------
# Odd sizes (d_model 48, 3 or 6 heads, d_mlp 72, vocab 97), fp32, eager attention, 2 layers; q/k
# projections (fused ones included) N(0, 0.25²), every other matrix and bias N(0, 0.1²), norm gains
# 1 + N(0, 0.2²) and norm biases N(0, 0.1²).

CLASSIC_VOCAB = 97
CLASSIC_BASE = dict(vocab_size=CLASSIC_VOCAB, bos_token_id=1, eos_token_id=2, attn_implementation="eager")

#: name -> (transformers config class, model class, config kwargs)
CLASSIC_FAMILIES = {
    # Pythia layout: parallel residual, rotary on a quarter of each head (4 of 16 dims).
    "neox_parallel_rot025": ("GPTNeoXConfig", "GPTNeoXForCausalLM", dict(
        hidden_size=48, num_attention_heads=3, intermediate_size=72, num_hidden_layers=2, max_position_embeddings=64,
        use_parallel_residual=True,
        rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.25),
    )),
    "neox_sequential_rot025": ("GPTNeoXConfig", "GPTNeoXForCausalLM", dict(
        hidden_size=48, num_attention_heads=3, intermediate_size=72, num_hidden_layers=2, max_position_embeddings=64,
        use_parallel_residual=False,
        rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.25),
    )),
    # Adjacent-pair rotary on 8 of 16 dims; one shared LayerNorm; lm_head bias.
    "gptj_rotary8of16": ("GPTJConfig", "GPTJForCausalLM", dict(
        n_embd=48, n_head=3, n_inner=72, n_layer=2, n_positions=64, rotary_dim=8,
    )),
    # Global then local layer, window 4 < sequence 12; no 1/sqrt(d_head) scaling.
    "gpt_neo_window4": ("GPTNeoConfig", "GPTNeoForCausalLM", dict(
        hidden_size=48, num_heads=3, intermediate_size=72, num_layers=2, max_position_embeddings=64,
        attention_types=[[["global", "local"], 1]], window_size=4,
    )),
    # Partial rotary 0.5; parallel block with one norm; lm_head bias.
    "phi_rot05": ("PhiConfig", "PhiForCausalLM", dict(
        hidden_size=48, num_attention_heads=3, intermediate_size=72, num_hidden_layers=2, max_position_embeddings=64,
        rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.5),
    )),
    # Phi's optional qk LayerNorm (one, with bias, shared by the heads) with grouped-query attention.
    "phi_qk_layernorm_gqa": ("PhiConfig", "PhiForCausalLM", dict(
        hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=72, num_hidden_layers=2,
        max_position_embeddings=64, qk_layernorm=True,
        rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.5),
    )),
    # Learned positions at offset 2, relu, tied.
    "opt": ("OPTConfig", "OPTForCausalLM", dict(
        hidden_size=48, num_attention_heads=3, ffn_dim=72, num_hidden_layers=2, max_position_embeddings=64,
        word_embed_proj_dim=48, pad_token_id=1,
    )),
    # ALiBi with 6 heads (not a power of two: 4 slopes from base 2^-2, 2 from base 2^-1); post-embedding LN.
    "bloom_6heads": ("BloomConfig", "BloomForCausalLM", dict(hidden_size=48, n_head=6, n_layer=2)),
    # Per-head qk LayerNorm, GQA 4:2, partial rotary 0.25 (4 of 16), SwiGLU.
    "stablelm_qk_norm_gqa": ("StableLmConfig", "StableLmForCausalLM", dict(
        hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=72, num_hidden_layers=2,
        max_position_embeddings=64, qk_layernorm=True, use_qkv_bias=True,
    )),
    # StableLM's parallel block (one norm) without qk-norm.
    "stablelm_parallel": ("StableLmConfig", "StableLmForCausalLM", dict(
        hidden_size=48, num_attention_heads=3, num_key_value_heads=3, intermediate_size=72, num_hidden_layers=2,
        max_position_embeddings=64, use_parallel_residual=True,
        rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.5),
    )),
    # Multi-query attention ([Q; K; V] blocks) with learned positions.
    "bigcode_mqa": ("GPTBigCodeConfig", "GPTBigCodeForCausalLM", dict(
        n_embd=48, n_head=3, n_inner=72, n_layer=2, n_positions=64, multi_query=True,
    )),
    # GQA 4:2, sliding window 5 < sequence 12, LayerNorm with biases, dense gelu MLP.
    "starcoder2_gqa_window5": ("Starcoder2Config", "Starcoder2ForCausalLM", dict(
        hidden_size=48, num_attention_heads=4, num_key_value_heads=2, intermediate_size=72, num_hidden_layers=2,
        max_position_embeddings=64, sliding_window=5,
    )),
    # MPT: ALiBi with 6 heads (MPT's slope order differs from Bloom's), clip_qkv that clips, no biases.
    "mpt_6heads_clip_qkv": ("MptConfig", "MptForCausalLM", dict(
        d_model=48, n_heads=6, n_layers=2, max_seq_len=64, attn_config=dict(clip_qkv=0.6),
    )),
    # CodeGen: q/v/k fused in 4 model-parallel shards, adjacent-pair rotary on 8 of 16 dims, parallel block.
    "codegen_mp4_rotary8": ("CodeGenConfig", "CodeGenForCausalLM", dict(
        n_embd=48, n_head=3, n_inner=72, n_layer=2, n_positions=64, rotary_dim=8,
    )),
    # XGLM: sinusoidal positions at offset 2, embeddings scaled by sqrt(48), biases everywhere.
    "xglm_sinusoidal": ("XGLMConfig", "XGLMForCausalLM", dict(
        d_model=48, attention_heads=3, ffn_dim=72, num_layers=2, max_position_embeddings=64, pad_token_id=1,
    )),
}  # fmt: skip

_CLASSIC_QK = re.compile(r"(q_proj|k_proj|query_key_value|c_attn|Wqkv|qkv_proj)\.weight$")
_CLASSIC_NORM = re.compile(r"(norm|ln_)")


def tiny_classic(name: str, seed: int = 0):
    """The HF model of `CLASSIC_FAMILIES[name]`, eager attention, every parameter redrawn (section comment)."""
    import transformers

    config_cls, model_cls, kwargs = CLASSIC_FAMILIES[name]
    config = getattr(transformers, config_cls)(**CLASSIC_BASE, **copy.deepcopy(kwargs))
    torch.manual_seed(seed)
    hf = getattr(transformers, model_cls)(config).eval()
    with torch.no_grad():
        for pname, p in hf.named_parameters():
            if _CLASSIC_NORM.search(pname) and p.ndim == 1 or "norms." in pname:
                p.copy_((1 if pname.endswith("weight") else 0) + 0.2 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.25 if _CLASSIC_QK.search(pname) else 0.1)
    return hf


def hf_layers(hf) -> torch.nn.ModuleList:
    """The decoder layers of any of the classic families."""
    base = hf.base_model
    for attr in ("layers", "h", "blocks"):  # ... MPT's
        if hasattr(base, attr):
            return getattr(base, attr)
    return base.decoder.layers  # OPT


# -- encoders: BERT, DistilBERT, T5, HuBERT -----------------------------------------------


def tiny_bert(cls_name: str, seed: int = 0, **overrides):
    """A random 2-layer BERT (d_model 32, 4 heads) of class `cls_name`, every parameter redrawn (module docstring)."""
    import transformers

    kwargs = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=32,
        pad_token_id=0,
        attn_implementation="eager",
    )
    kwargs.update(overrides)
    torch.manual_seed(seed)
    hf = getattr(transformers, cls_name)(transformers.BertConfig(**kwargs)).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "LayerNorm.weight" in name:
                p.copy_(1 + 0.2 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.25 if name.endswith(("query.weight", "key.weight")) else 0.1)
    return hf


def tiny_distilbert(cls_name: str, seed: int = 0):
    """A random 2-layer DistilBERT of class `cls_name`, redrawn as `tiny_bert`."""
    import transformers

    torch.manual_seed(seed)
    config = transformers.DistilBertConfig(
        vocab_size=VOCAB,
        dim=32,
        n_layers=2,
        n_heads=4,
        hidden_dim=64,
        max_position_embeddings=32,
        pad_token_id=0,
        attn_implementation="eager",
    )
    hf = getattr(transformers, cls_name)(config).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "layer_norm.weight" in name or "LayerNorm.weight" in name:
                p.copy_(1 + 0.2 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.25 if name.endswith(("q_lin.weight", "k_lin.weight")) else 0.1)
    return hf


T5_EOS = 1


def tiny_t5(seed: int, **overrides):
    """A random 2-layer `T5ForConditionalGeneration`, 8 relative-position buckets (max distance 16)."""
    import transformers

    kwargs = dict(
        vocab_size=VOCAB,
        d_model=32,
        d_kv=8,
        d_ff=64,
        num_layers=2,
        num_heads=4,
        relative_attention_num_buckets=8,
        relative_attention_max_distance=16,
        decoder_start_token_id=0,
        pad_token_id=0,
        eos_token_id=T5_EOS,
        attn_implementation="eager",
    )
    kwargs.update(overrides)
    torch.manual_seed(seed)
    hf = transformers.T5ForConditionalGeneration(transformers.T5Config(**kwargs)).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "layer_norm" in name:
                p.copy_(1 + 0.2 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.25 if name.endswith(("q.weight", "k.weight")) else 0.1)
    return hf


def tiny_hubert(seed: int, **overrides):
    """A random 2-layer `HubertModel` with a 3-layer conv front end; the positional conv's weight norm redrawn too."""
    import transformers

    kwargs = dict(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        conv_dim=(16, 16, 16),
        conv_kernel=(10, 3, 2),
        conv_stride=(5, 2, 2),
        num_conv_pos_embeddings=8,
        num_conv_pos_embedding_groups=4,
        attn_implementation="eager",
    )
    kwargs.update(overrides)
    torch.manual_seed(seed)
    hf = transformers.HubertModel(transformers.HubertConfig(**kwargs)).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "norm" in name and name.endswith("weight") and "pos_conv" not in name:
                p.copy_(1 + 0.2 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.25 if name.endswith(("q_proj.weight", "k_proj.weight")) else 0.1)
    return hf


# -- state-space and hybrid models (issue 38) ---------------------------------------------
# d_model 32, vocab 96, fp32, eager attention. Mamba-2's chunk (8) and DeltaNet's (64, fixed by HF) are
# shorter than the parity sequences, so the carry across chunks is exercised. Parameters redrawn as
# above; the scan parameters (A_log, D, dt_bias) keep HF's init plus N(0, 0.1^2) noise, so decays stay
# in (0, 1) and steps positive; zero-centred norms (Qwen3-Next's `1 + w`) are drawn around 0. The gated
# DeltaNet's A is redrawn in (0.01, 0.1) (per-step decays 0.87-0.99): with HF's A up to 16, the chunked
# rule's cumulative log-decays reach about -1000, and float32 cancellation in their differences alone
# moves the log-probs by 2e-5 for a 1e-7 relative change of an input (measured), so no two orders of
# the same arithmetic (HF's fused projections and ours, or folded weights) agree to 1e-5.

_ATTN = dict(num_attention_heads=4, num_key_value_heads=2, attn_implementation="eager")
_DELTANET = dict(
    _ATTN, head_dim=8, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
    linear_value_head_dim=6, linear_conv_kernel_dim=4, num_hidden_layers=4,
    layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
)  # fmt: skip
_GRANITE_HYBRID = dict(
    _ATTN, num_hidden_layers=4, intermediate_size=24, shared_intermediate_size=40, num_local_experts=4,
    num_experts_per_tok=2, mamba_n_heads=8, mamba_d_head=8, mamba_d_state=8, mamba_n_groups=2, mamba_chunk_size=8,
    position_embedding_type="rope", layer_types=["mamba", "attention", "mamba", "mamba"], embedding_multiplier=3.0,
    attention_multiplier=0.3, residual_multiplier=0.5, logits_scaling=4.0,
)  # fmt: skip

#: name -> (HF model class, HF config class, config overrides, parity sequence length)
SSM_CONFIGS = {
    "mamba": ("MambaForCausalLM", "MambaConfig", dict(state_size=8, expand=2), 20),
    "mamba2": (
        "Mamba2ForCausalLM", "Mamba2Config",
        dict(num_heads=8, head_dim=8, state_size=16, n_groups=2, chunk_size=8, expand=2), 20,
    ),
    "nemotron_h": (
        "NemotronHForCausalLM", "NemotronHConfig",
        dict(
            _ATTN, head_dim=8, intermediate_size=48, ssm_state_size=8, mamba_num_heads=8, mamba_head_dim=8,
            n_groups=2, chunk_size=8, layers_block_type=["linear_attention", "mlp", "full_attention", "mlp",
            "linear_attention"],
        ), 20,
    ),
    "granite_hybrid_moe": ("GraniteMoeHybridForCausalLM", "GraniteMoeHybridConfig", _GRANITE_HYBRID, 20),
    "qwen3_next_moe": (
        "Qwen3NextForCausalLM", "Qwen3NextConfig",
        dict(_DELTANET, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24,
             shared_expert_intermediate_size=20),
        70,
    ),
    "qwen3_5": ("Qwen3_5ForCausalLM", "Qwen3_5TextConfig", dict(_DELTANET, intermediate_size=40), 70),
    # the text tower of the image-text class (a one-block vision tower, never run: text-only inputs)
    "qwen3_5_multimodal": (
        "Qwen3_5ForConditionalGeneration", "Qwen3_5Config", dict(_DELTANET, intermediate_size=40), 70,
    ),
    "lfm2": (
        "Lfm2ForCausalLM", "Lfm2Config",
        dict(
            _ATTN, num_hidden_layers=4, layer_types=["conv", "full_attention", "conv", "conv"], conv_bias=True,
            intermediate_size=96, block_multiple_of=8,
        ), 20,
    ),
    "lfm2_moe": (
        "Lfm2MoeForCausalLM", "Lfm2MoeConfig",
        dict(
            _ATTN, num_hidden_layers=4, layer_types=["conv", "full_attention", "conv", "conv"], intermediate_size=48,
            moe_intermediate_size=24, num_experts=4, num_experts_per_tok=2, num_dense_layers=1,
            routed_scaling_factor=1.5,
        ), 20,
    ),
}  # fmt: skip


def tiny_ssm(name: str, seed: int = 0, **changes):
    """The random HF model of `SSM_CONFIGS[name]` (`changes` applied to its config), every parameter redrawn."""
    import transformers

    model_cls, config_cls, overrides, _ = SSM_CONFIGS[name]
    kwargs = dict(hidden_size=32, num_hidden_layers=2, vocab_size=VOCAB, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    kwargs.update(copy.deepcopy(overrides))
    kwargs.update(changes)
    if config_cls == "Qwen3_5Config":  # image-text: the text config nested, a tiny vision tower
        attn = kwargs.pop("attn_implementation")
        vision = dict(depth=1, hidden_size=16, num_heads=2, intermediate_size=32, out_hidden_size=32, patch_size=4,
                      spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=16)  # fmt: skip
        specials = dict(image_token_id=95, video_token_id=94, vision_start_token_id=93, vision_end_token_id=92)
        kwargs = dict(text_config=kwargs, vision_config=vision, attn_implementation=attn, **specials)
    torch.manual_seed(seed)
    hf = getattr(transformers, model_cls)(getattr(transformers, config_cls)(**kwargs)).eval()
    zero_centred = model_cls.startswith("Qwen3")  # HF's norm gain is 1 + w
    with torch.no_grad():
        for pname, p in hf.named_parameters():
            if pname.endswith("linear_attn.A_log"):  # per-step decays exp(g) in (0.87, 0.99), see above
                p.copy_(torch.empty_like(p).uniform_(0.01, 0.1).log())
            elif pname.endswith(("A_log", ".D", "dt_bias")):
                p.add_(0.1 * torch.randn_like(p))
            elif "norm" in pname and zero_centred and "linear_attn.norm" not in pname:
                p.copy_(0.3 * torch.randn_like(p))
            elif "norm" in pname:
                p.copy_(1 + 0.2 * torch.randn_like(p))
            else:
                sharp = pname.endswith(("q_proj.weight", "k_proj.weight", "gate.weight", "router.weight"))
                p.normal_(0.0, 0.25 if sharp else 0.1)
    with torch.no_grad():  # LFM2-MoE's selection bias is a buffer: make it matter
        for bname, buffer in hf.named_buffers():
            if bname.endswith("expert_bias"):
                buffer.normal_(0.0, 0.1)
    return hf


def ssm_layers(hf):
    """The decoder layers of a tiny state-space or hybrid HF model."""
    inner = hf.backbone if hasattr(hf, "backbone") else hf.model
    return inner.language_model.layers if hasattr(inner, "language_model") else inner.layers


# -- hooked models from a config alone (no HF model): circuits, compat, CUDA --------------

HOOKED_BASE = dict(d_model=32, d_head=8, n_layers=2, n_ctx=16, d_vocab=50, d_mlp=48, seed=0)
HOOKED_ROTARY = dict(normalization_type="RMS", positional_embedding_type="rotary", act_fn="silu", gated_mlp=True)
#: family -> HookedTransformerConfig fields on top of HOOKED_BASE
HOOKED_FAMILIES = {
    "gpt2": dict(act_fn="gelu"),
    "llama_gqa": dict(HOOKED_ROTARY, n_key_value_heads=2),
    "moe": dict(HOOKED_ROTARY, num_experts=4, experts_per_token=2),
    "neox_parallel": dict(act_fn="gelu", parallel_attn_mlp=True, positional_embedding_type="rotary"),
    "gemma_post_norm": dict(HOOKED_ROTARY, use_normalization_before_and_after=True, n_key_value_heads=1),
    "olmo2_post_norm": dict(HOOKED_ROTARY, post_sublayer_norm=True),
    "attn_only_shortformer": dict(attn_only=True, positional_embedding_type="shortformer"),
    # a hybrid: Mamba-2, gated attention and gated DeltaNet layers, each with an MLP (issue 38)
    "hybrid_ssm": dict(
        HOOKED_ROTARY,
        n_layers=3,
        layer_types=["mamba2", "attention", "gated_deltanet"],
        attn_output_gate=True,
        ssm_d_state=8,
        ssm_d_inner=32,
        ssm_n_heads=4,
        ssm_n_groups=2,
        ssm_chunk_size=4,
        deltanet_n_key_heads=2,
        deltanet_n_value_heads=4,
        deltanet_d_key_head=8,
        deltanet_d_value_head=8,
    ),
}


def tiny_hooked(family: str, **overrides):
    """A HookedTransformer of `HOOKED_FAMILIES[family]`, initialised by the config's seed; overrides win."""
    from hooked import HookedTransformer, HookedTransformerConfig

    return HookedTransformer(HookedTransformerConfig(**{**HOOKED_BASE, **HOOKED_FAMILIES[family], **overrides}))


def token_pair(batch: int = 3, pos: int = 6, seed: int = 0, positions=(2,)) -> tuple[torch.Tensor, torch.Tensor]:
    """Random clean tokens for `tiny_hooked` models and a corrupted copy differing at `positions`."""
    gen = torch.Generator().manual_seed(seed)
    clean = torch.randint(0, HOOKED_BASE["d_vocab"], (batch, pos), generator=gen)
    corrupted = clean.clone()
    for p in positions:
        corrupted[:, p] = torch.randint(0, HOOKED_BASE["d_vocab"], (batch,), generator=gen)
    return clean, corrupted


# -- image-text models: LLaVA, LLaVA-NeXT, LLaVA-OneVision, Gemma 3 (issue 39) -------------
# A 28-pixel image (or tile) in 7-pixel patches: a 4 x 4 grid. The ViTs have 3 blocks (LLaVA reads
# block 2's output, -2), d_model 24 in 3 heads; the language models are 2-layer, d_model 32, with GQA.
# Any-resolution grids up to 2 x 2 tiles; OneVision's anyres_max_1 shrinks every grid (bilinearly).

VLM_PINPOINTS = [[28, 56], [56, 28], [56, 56]]
VLM_VOCAB = 303  # make_tokenizer's 300 tokens and 3 image specials
#: the image tokenizers' specials: LLaVA's placeholder, Gemma 3's begin/soft/end of image
LLAVA_IMAGE_TOKEN, GEMMA_IMAGE_TOKENS = "<image>", ("<start_of_image>", "<image_soft_token>", "<end_of_image>")
_VLM_TEXT = dict(
    hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    vocab_size=VLM_VOCAB, max_position_embeddings=128, pad_token_id=2, bos_token_id=1, eos_token_id=0,
)  # fmt: skip
_VLM_VISION = dict(
    hidden_size=24, intermediate_size=40, num_hidden_layers=3, num_attention_heads=3, image_size=28, patch_size=7
)
_CLIP = dict(_VLM_VISION, model_type="clip_vision_model", hidden_act="quick_gelu")
_SIGLIP = dict(_VLM_VISION, model_type="siglip_vision_model")

#: name -> (HF class prefix, config kwargs)
VLM_CONFIGS = {
    "llava": ("Llava", dict(
        text_config=dict(_VLM_TEXT, model_type="llama"), vision_config=_CLIP, image_token_id=300,
        vision_feature_layer=-2, vision_feature_select_strategy="default", projector_hidden_act="gelu",
    )),
    "llava_next": ("LlavaNext", dict(
        text_config=dict(_VLM_TEXT, model_type="mistral", sliding_window=None), vision_config=_CLIP,
        image_token_id=300, image_grid_pinpoints=VLM_PINPOINTS, vision_feature_layer=[-3, -2],
    )),
    "llava_onevision": ("LlavaOnevision", dict(
        text_config=dict(_VLM_TEXT, model_type="qwen2"), vision_config=_SIGLIP, image_token_id=300,
        image_grid_pinpoints=VLM_PINPOINTS, vision_feature_layer=-1, vision_feature_select_strategy="full",
        vision_aspect_ratio="anyres_max_1",
    )),
    # images at their own grid: 7-pixel patches, 2 x 2 merged into one token, windows of 28 pixels (2 x 2
    # tokens) in blocks 0 and 1, the whole image in block 2; M-RoPE over 2 + 1 + 1 of each head's 4 frequencies
    "qwen2_5_vl": ("Qwen2_5_VL", dict(
        text_config=dict(_VLM_TEXT, rope_parameters=dict(rope_type="default", rope_theta=1e4, mrope_section=[2, 1, 1])),
        vision_config=dict(depth=3, hidden_size=24, intermediate_size=40, num_heads=3, patch_size=7, window_size=28,
                           spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=32, fullatt_block_indexes=[2]),
        image_token_id=300, video_token_id=301, vision_start_token_id=302,
    )),
    "gemma3_pooled": ("Gemma3", dict(
        text_config=dict(_VLM_TEXT, head_dim=16, sliding_window=4, query_pre_attn_scalar=24,
                         layer_types=["sliding_attention", "full_attention"], rope_parameters=GEMMA3_ROPE),
        vision_config=dict(_SIGLIP, image_size=28, patch_size=7), mm_tokens_per_image=4, image_token_index=301,
        boi_token_index=300, eoi_token_index=302,
    )),
}  # fmt: skip


def tiny_vlm(name: str, seed: int = 0):
    """The random HF image-text model of `VLM_CONFIGS[name]` (eager attention), every parameter redrawn.

    As the decoders above: q/k N(0, 0.25²), other matrices, biases and embeddings N(0, 0.1²),
    LayerNorm gains 1 + N(0, 0.2²); Gemma's `1 + w` norms (the text model's and the projector's)
    w ~ N(0, 0.3²).
    """
    import transformers

    prefix, kwargs = VLM_CONFIGS[name]
    config = getattr(transformers, prefix + "Config")(**copy.deepcopy(kwargs), attn_implementation="eager")
    torch.manual_seed(seed)
    hf = getattr(transformers, prefix + "ForConditionalGeneration")(config).eval()
    gemma = prefix == "Gemma3"
    with torch.no_grad():
        for pname, p in hf.named_parameters():
            if "norm" in pname and gemma and "vision_tower" not in pname:
                p.copy_(0.3 * torch.randn_like(p))  # gain 1 + w
            elif "norm" in pname:
                p.copy_((1 if pname.endswith("weight") else 0) + 0.2 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.25 if pname.endswith(("q_proj.weight", "k_proj.weight")) else 0.1)
    return hf


def vlm_tokenizer(name: str):
    """`make_tokenizer` (BOS first) with the image specials of `name`'s processor, ids 300-302."""
    tok = make_tokenizer(prepends_bos=True)
    if name.startswith("gemma3"):
        tok.add_special_tokens({"additional_special_tokens": list(GEMMA_IMAGE_TOKENS)})
        boi, soft, eoi = GEMMA_IMAGE_TOKENS
        tok._set_model_specific_special_tokens(special_tokens=dict(boi_token=boi, image_token=soft, eoi_token=eoi))
    else:
        tok.add_special_tokens({"additional_special_tokens": [LLAVA_IMAGE_TOKEN, "<extra1>", "<extra2>"]})
    return tok


def vlm_image_processor(name: str):
    """The slow (PIL) image processor of `name`'s family for 28-pixel tiles (no torchvision needed)."""
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil
    from transformers.models.llava_next.image_processing_pil_llava_next import LlavaNextImageProcessorPil
    from transformers.models.llava_onevision.image_processing_pil_llava_onevision import (
        LlavaOnevisionImageProcessorPil,
    )
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    square = dict(size={"shortest_edge": 28}, crop_size={"height": 28, "width": 28})
    return {
        "llava": lambda: CLIPImageProcessorPil(**square),
        "llava_next": lambda: LlavaNextImageProcessorPil(**square, image_grid_pinpoints=VLM_PINPOINTS),
        "llava_onevision": lambda: LlavaOnevisionImageProcessorPil(
            size={"height": 28, "width": 28}, image_grid_pinpoints=VLM_PINPOINTS
        ),
        "gemma3_pooled": lambda: Gemma3ImageProcessorPil(size={"height": 28, "width": 28}),
        "qwen2_5_vl": lambda: Qwen2VLImageProcessorPil(
            patch_size=7, merge_size=2, temporal_patch_size=2, min_pixels=14 * 14, max_pixels=56 * 56
        ),
    }[name]()


def vlm_processor(name: str):
    """The HF processor of `name` (image processor and tokenizer). LLaVA-OneVision's and Qwen2.5-VL's need
    torchvision (for their video processors), which this environment lacks: None for them."""
    import transformers

    tok, images = vlm_tokenizer(name), vlm_image_processor(name)
    clip = dict(patch_size=7, vision_feature_select_strategy="default", num_additional_image_tokens=1)
    if name == "llava":
        return transformers.LlavaProcessor(image_processor=images, tokenizer=tok, **clip)
    if name == "llava_next":
        return transformers.LlavaNextProcessor(image_processor=images, tokenizer=tok, **clip)
    if name == "gemma3_pooled":
        return transformers.Gemma3Processor(image_processor=images, tokenizer=tok, image_seq_length=4)
    return None


def save_tiny_vlm(name: str, directory, seed: int = 0):
    """Save `tiny_vlm(name, seed)`, its tokenizer and (where it can be built) its processor to `directory`;
    return the HF model."""
    hf = tiny_vlm(name, seed)
    hf.save_pretrained(directory)
    processor = vlm_processor(name)
    if processor is not None:
        processor.save_pretrained(directory)
    else:
        vlm_tokenizer(name).save_pretrained(directory)
    return hf


def tiny_image(seed: int = 0, height: int = 40, width: int = 70):
    """A random RGB PIL image of `height` x `width` pixels (not square: any-resolution grids are 1 x 2)."""
    import numpy as np
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, size=(height, width, 3), dtype=np.uint8)
    return Image.fromarray(pixels)


# -- one builder per decoder family, for sweeps (half precision, compile, static cache, CUDA) --


def _modern(prefix: str, **overrides) -> Callable:
    def build(seed: int = 0):
        return tiny_hf(prefix, seed=seed, **overrides)

    return build


def _classic(name: str) -> Callable:
    def build(seed: int = 0):
        return tiny_classic(name, seed=seed)

    return build


def _gpt2(seed: int = 0):
    return tiny_gpt2(seed=seed, vocab_size=96, n_positions=64)


def _gemma(name: str) -> Callable:
    def build(seed: int = 0):
        return tiny_gemma(name, seed=seed)

    return build


def _gemma_ple(name: str) -> Callable:
    def build(seed: int = 0):
        return tiny_gemma_ple(name, seed=seed)

    return build


def _moe(name: str) -> Callable:
    def build(seed: int = 0):
        prefix, overrides = MOE_CONFIGS[name]
        return tiny_moe(prefix, seed=seed, **overrides)

    return build


def _routed(name: str) -> Callable:
    def build(seed: int = 0):
        return tiny_routed(name, seed=seed)

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
EVERY_FAMILY: dict[str, Callable[..., torch.nn.Module]] = {
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
    "mpt": _classic("mpt_6heads_clip_qkv"),
    "codegen": _classic("codegen_mp4_rotary8"),
    "xglm": _classic("xglm_sinusoidal"),
    "hunyuan": _modern("HunYuanDenseV1", num_key_value_heads=2, head_dim=8),
    "gemma4": _gemma_ple("gemma4_kv_shared_ple"),
    "gemma4_multimodal": _gemma_ple("gemma4_image_text_tower"),
    "gemma3n": _gemma_ple("gemma3n_altup_laurel_sparse"),
    "deepseek_v2": _routed("deepseek_v2_group_limited"),
    "deepseek_v3": _routed("deepseek_v3_group_limited"),
    "glm_moe_dsa": _routed("glm_moe_dsa_topk4"),
    "glm4_moe": _routed("glm4_moe_qk_norm_groups"),
    "phimoe": _routed("phimoe_sparsemixer"),
    "granitemoe": _routed("granitemoe_multipliers"),
}
