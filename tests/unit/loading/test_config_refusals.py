"""Every registered architecture: its HF class's default config converts, and a value it does not implement is refused.

A converter that silently ignored an HF config field would load a model computing something
else than the checkpoint. For each HF class `hooked.loading` registers, the class's own default
config (where HF's default is no model, with the smallest change that makes one: `BASES`)
converts into a valid `HookedTransformerConfig`, and one value HF implements but the
converter does not (an activation, a dense layer in a MoE, a bidirectional or post-LayerNorm
variant, ...) raises `UnsupportedConfigError` naming the field. Every table entry is a real HF
value (HF builds the model), and every registered class must have one.
"""

from __future__ import annotations

import pytest
import transformers

from hooked import HookedTransformerConfig, loading
from hooked.core.errors import UnsupportedConfigError
from hooked.loading.config_checks import ROPE_TYPES

GEMMA3_TEXT = {"text_config": {"hidden_activation": "mish"}}
GLM_DSA_LAYERS = transformers.GlmMoeDsaConfig().num_hidden_layers  # HF checks one layer type per layer

#: HF class -> (config changes, the field the refusal names)
REFUSALS: dict[str, tuple[dict, str]] = {
    "GPT2LMHeadModel": (dict(activation_function="mish"), "activation_function"),
    "LlamaForCausalLM": (dict(hidden_act="relu2"), "hidden_act"),
    "MistralForCausalLM": (dict(hidden_act="mish"), "hidden_act"),
    "Qwen2ForCausalLM": (dict(hidden_act="mish"), "hidden_act"),
    "Qwen3ForCausalLM": (dict(hidden_act="gelu_10"), "hidden_act"),
    "ApertusForCausalLM": (dict(hidden_act="relu2"), "hidden_act"),
    "GemmaForCausalLM": (dict(use_bidirectional_attention=True), "use_bidirectional_attention"),
    "Gemma2ForCausalLM": (dict(use_bidirectional_attention=True), "use_bidirectional_attention"),
    "Gemma3ForCausalLM": (dict(use_bidirectional_attention=True), "use_bidirectional_attention"),
    "Gemma3ForConditionalGeneration": (GEMMA3_TEXT, "hidden_activation"),
    "Gemma4ForCausalLM": (dict(enable_moe_block=True), "enable_moe_block"),
    "Gemma4ForConditionalGeneration": (
        {"text_config": {"use_bidirectional_attention": "all"}},
        "use_bidirectional_attention",
    ),
    "Gemma3nForCausalLM": (dict(hidden_activation="relu2"), "hidden_activation"),
    "MixtralForCausalLM": (dict(hidden_act="relu2"), "hidden_act"),
    "Qwen2MoeForCausalLM": (dict(mlp_only_layers=[0]), "mlp_only_layers"),
    "Qwen3MoeForCausalLM": (dict(decoder_sparse_step=2), "decoder_sparse_step"),
    "OlmoeForCausalLM": (dict(hidden_act="mish"), "hidden_act"),
    "OlmoForCausalLM": (dict(hidden_act="relu2"), "hidden_act"),
    "Olmo2ForCausalLM": (dict(hidden_act="relu2"), "hidden_act"),
    "Olmo3ForCausalLM": (dict(hidden_act="relu2"), "hidden_act"),
    "Phi3ForCausalLM": (dict(hidden_act="mish"), "hidden_act"),
    "SmolLM3ForCausalLM": (dict(hidden_act="relu2"), "hidden_act"),
    "GraniteForCausalLM": (dict(hidden_act="relu2"), "hidden_act"),
    "CohereForCausalLM": (dict(hidden_act="relu2"), "hidden_act"),
    "FalconForCausalLM": (dict(activation="mish"), "activation"),
    "GptOssForCausalLM": (dict(rope_parameters=dict(rope_type="ntk_by_parts", rope_theta=1e4)), "rope_type"),
    "GPTNeoXForCausalLM": (dict(hidden_act="mish"), "hidden_act"),
    "GPTJForCausalLM": (dict(activation_function="mish"), "activation_function"),
    "GPTNeoForCausalLM": (dict(activation_function="relu2"), "activation_function"),
    "PhiForCausalLM": (dict(hidden_act="mish"), "hidden_act"),
    "OPTForCausalLM": (dict(do_layer_norm_before=False), "do_layer_norm_before"),
    "BloomForCausalLM": (dict(apply_residual_connection_post_layernorm=True), "apply_residual_connection"),
    "StableLmForCausalLM": (dict(hidden_act="relu2"), "hidden_act"),
    "GPTBigCodeForCausalLM": (dict(activation_function="mish"), "activation_function"),
    "Starcoder2ForCausalLM": (dict(hidden_act="mish"), "hidden_act"),
    "MptForCausalLM": (dict(attn_config=dict(qk_ln=True)), "attn_config.qk_ln"),
    "CodeGenForCausalLM": (dict(activation_function="mish"), "activation_function"),
    "XGLMForCausalLM": (dict(add_cross_attention=True), "add_cross_attention"),
    "HunYuanDenseV1ForCausalLM": (dict(hidden_act="relu2"), "hidden_act"),
    "DeepseekV2ForCausalLM": (dict(mlp_bias=True), "mlp_bias"),
    "DeepseekV3ForCausalLM": (dict(rope_parameters=dict(rope_type="dynamic", factor=2.0, rope_theta=1e4)), "rope_type"),
    "GlmMoeDsaForCausalLM": (dict(layer_types=["full_attention"] * GLM_DSA_LAYERS), "layer_types"),
    "Glm4MoeForCausalLM": (dict(hidden_act="relu2"), "hidden_act"),
    "PhimoeForCausalLM": (dict(num_experts_per_tok=3), "num_experts_per_tok"),
    "GraniteMoeForCausalLM": (dict(rope_parameters=dict(rope_type="dynamic", factor=2.0, rope_theta=1e4)), "rope_type"),
    "LlavaForConditionalGeneration": (dict(projector_hidden_act="mish"), "projector_hidden_act"),
    "LlavaNextForConditionalGeneration": (
        {"vision_config": {"model_type": "clip_vision_model", "hidden_act": "relu2"}},
        "vision_config.hidden_act",
    ),
    "LlavaOnevisionForConditionalGeneration": (
        {"text_config": {"model_type": "qwen2", "hidden_act": "mish"}},
        "hidden_act",
    ),
    "Qwen2_5_VLForConditionalGeneration": ({"vision_config": {"hidden_act": "gelu_10"}}, "vision_config.hidden_act"),
    "MambaForCausalLM": (dict(hidden_act="gelu"), "hidden_act"),
    "Mamba2ForCausalLM": (dict(hidden_act="gelu"), "hidden_act"),
    "NemotronHForCausalLM": (
        dict(layers_block_type=["linear_attention", "moe", "full_attention", "mlp"]),
        "layers_block_type",
    ),
    "GraniteMoeHybridForCausalLM": (dict(hidden_act="gelu"), "hidden_act"),
    "Qwen3NextForCausalLM": (dict(mlp_only_layers=[0]), "mlp_only_layers"),
    "Qwen3_5ForCausalLM": (dict(hidden_act="gelu"), "hidden_act"),
    "Qwen3_5ForConditionalGeneration": ({"text_config": {"hidden_act": "gelu"}}, "hidden_act"),
    "Lfm2ForCausalLM": (dict(rope_parameters=dict(rope_type="linear", factor=2.0, rope_theta=1e6)), "rope_type"),
    "Lfm2MoeForCausalLM": (dict(rope_parameters=dict(rope_type="linear", factor=2.0, rope_theta=1e6)), "rope_type"),
    "T5ForConditionalGeneration": (dict(feed_forward_proj="gated-mish"), "feed_forward_proj"),
    "HubertModel": (dict(conv_pos_batch_norm=True), "conv_pos_batch_norm"),
    "BertForPreTraining": (dict(is_decoder=True), "is_decoder"),
    "BertForMaskedLM": (dict(hidden_act="mish"), "hidden_act"),
    "BertForNextSentencePrediction": (dict(is_decoder=True), "is_decoder"),
    "BertModel": (dict(hidden_act="relu2"), "hidden_act"),
    "DistilBertForMaskedLM": (dict(activation="mish"), "activation"),
    "DistilBertModel": (dict(activation="relu2"), "activation"),
}


#: HF classes whose default config is no model HF builds either, and the smallest change that makes one
BASES: dict[str, dict] = {
    # the default SigLIP (224 / 16: 14 patches a side) cannot pool into 256 image tokens; Gemma 3's is 896 / 14
    "Gemma3ForConditionalGeneration": {"vision_config": {"image_size": 896, "patch_size": 14}},
    "DeepseekV2ForCausalLM": dict(num_experts_per_tok=6),  # the default leaves the router's top-k unset
    "Glm4MoeForCausalLM": dict(head_dim=128),  # the default 4096 wide / 96 heads has no integer head width
    # hooked's ViT reads whole patches (image_size a multiple of patch_size); the default SigLIP is 384 / 14
    "LlavaOnevisionForConditionalGeneration": {
        "vision_config": {"model_type": "siglip_vision_model", "image_size": 378, "patch_size": 14}
    },
    # Nemotron-H's default pattern has a MoE layer (refused); this one has its other three layer types
    "NemotronHForCausalLM": dict(layers_block_type=["linear_attention", "mlp", "full_attention", "mlp"]),
    # LFM2-MoE's default names no layer types (HF's model reads one per layer)
    "Lfm2MoeForCausalLM": dict(layer_types=["conv", "conv", "full_attention", "conv"] * 8),
}


def converter(hf_class: str):
    if hf_class in loading.registry.MODEL_CLASS_ARCHITECTURES:
        return loading.registry.MODEL_CLASS_ARCHITECTURES[hf_class][1].config
    return loading.get_architecture(hf_class).config


def hf_config(hf_class: str, **changes):
    """The class's default config (plus `BASES`) with `changes`; a sub-config dict updates the base's."""
    fields = dict(BASES.get(hf_class, {}))
    for name, value in changes.items():
        merge = isinstance(value, dict) and isinstance(fields.get(name), dict)
        fields[name] = {**fields[name], **value} if merge else value
    return getattr(transformers, hf_class).config_class(**fields)


def test_every_registered_architecture_has_a_refusal():
    registered = set(loading.ARCHITECTURES) | set(loading.registry.MODEL_CLASS_ARCHITECTURES)
    assert set(REFUSALS) == registered


@pytest.mark.parametrize("hf_class", sorted(REFUSALS))
def test_default_config_converts_and_an_unimplemented_value_is_refused(hf_class):
    fields = converter(hf_class)(hf_config(hf_class))
    HookedTransformerConfig(**fields)  # a valid config, as loading builds it
    changes, field = REFUSALS[hf_class]
    with pytest.raises(UnsupportedConfigError, match=rf"config\.[\w.\[\]']*{field}"):
        converter(hf_class)(hf_config(hf_class, **changes))


def test_the_refused_values_are_real_hf_values():
    """HF builds a model of each refused value, so every one is something HF computes and hooked would not."""
    for hf_class in ("LlamaForCausalLM", "Qwen2MoeForCausalLM", "MptForCausalLM"):
        changes, _ = REFUSALS[hf_class]
        small = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, vocab_size=32)
        if hf_class == "MptForCausalLM":
            small = dict(d_model=16, n_heads=2, n_layers=1, vocab_size=32)
        if hf_class == "Qwen2MoeForCausalLM":
            small.update(
                num_experts=2, num_experts_per_tok=1, moe_intermediate_size=8, shared_expert_intermediate_size=8
            )
        getattr(transformers, hf_class)(hf_config(hf_class, **small, **changes))


def test_a_rope_kind_rotary_does_not_compute_is_refused_per_layer_type():
    rope = {
        "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
        "full_attention": {"rope_type": "ntk_by_parts", "rope_theta": 1e6},
    }
    config = hf_config("Gemma3ForCausalLM")
    config.rope_parameters = rope
    message = r"config\.rope_parameters\['full_attention'\]\['rope_type'\]='ntk_by_parts'.*" + ", ".join(
        sorted(ROPE_TYPES)
    )
    with pytest.raises(UnsupportedConfigError, match=message):
        converter("Gemma3ForCausalLM")(config)
