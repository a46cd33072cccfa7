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
the classic families (NeoX, GPT-J, OPT, BLOOM, ...); encoders (BERT, DistilBERT, T5, HuBERT);
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
}
