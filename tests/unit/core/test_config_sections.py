"""`HookedTransformerConfig` reads as a document: sectioned fields, each documented; derived facts defined once.

Also: the architecture registry refuses to register an HF class twice.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import pickle
import re

import pytest
import torch

import hooked.core.config as config_module
from hooked.core.config import POST_NORM_ARCHITECTURES, HookedTransformerConfig
from hooked.core.errors import DuplicateArchitectureError, InputTypeError

torch.set_num_threads(1)

SECTIONS = (
    "shape",
    "positions",
    "attention",
    "norms",
    "MLP and mixture of experts",
    "recurrent layers",
    "hook switches",
    "HF numerics",
    "runtime",
    "image-text models",
    "provenance",
    "accepted for TransformerLens",
)
SECTION_HEADER = re.compile(r"^    # -- (.+?)(?::.*?)? -{3,}$")


def _class_body() -> list[ast.stmt]:
    tree = ast.parse(inspect.getsource(config_module))
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "HookedTransformerConfig"]
    return cls.body


def _field_sections() -> dict[str, str]:
    """Field name -> the section header above it in the source."""
    lines = inspect.getsource(config_module).splitlines()
    fields = {s.target.id: s.lineno for s in _class_body() if isinstance(s, ast.AnnAssign)}
    headers = [(i + 1, m.group(1)) for i, line in enumerate(lines) if (m := SECTION_HEADER.match(line))]
    return {name: max((h for h in headers if h[0] < lineno), default=(0, None))[1] for name, lineno in fields.items()}


# -- the document ----------------------------------------------------------------------------


def test_every_field_has_a_docstring_right_below_it():
    body = _class_body()
    undocumented = []
    for stmt, after in zip(body, body[1:] + [None], strict=True):
        if isinstance(stmt, ast.AnnAssign):
            documented = isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
            if not (documented and isinstance(after.value.value, str) and after.value.value.strip()):
                undocumented.append(stmt.target.id)
    assert undocumented == []


def test_the_source_lists_exactly_the_dataclass_fields():
    in_source = [s.target.id for s in _class_body() if isinstance(s, ast.AnnAssign)]
    assert in_source == [f.name for f in dataclasses.fields(HookedTransformerConfig)]


def test_sections_come_in_order_and_every_field_sits_in_one():
    sections = _field_sections()
    assert None not in sections.values(), [name for name, s in sections.items() if s is None]
    order = list(dict.fromkeys(sections.values()))  # headers in the order their fields appear
    assert [s.split(":")[0] for s in order] == [s for s in SECTIONS]


def test_the_class_docstring_names_every_section():
    doc = HookedTransformerConfig.__doc__
    for section in ("shape", "positions", "attention", "norms", "hook switches", "HF numerics", "runtime"):
        assert f"**{section}" in doc, section
    assert "**provenance**" in doc and "**accepted for TransformerLens**" in doc


@pytest.mark.parametrize(
    ("field", "section"),
    [
        ("d_model", "shape"),
        ("rotary_base", "positions"),
        ("n_key_value_heads", "attention"),
        ("post_sublayer_norm", "norms"),
        ("num_experts", "MLP and mixture of experts"),
        ("use_attn_result", "hook switches"),
        ("bias_after_matmul", "HF numerics"),
        ("norm_gain_fp32_in_float16", "HF numerics"),
        ("dtype", "runtime"),
        ("vision_language", "image-text models"),
        ("original_architecture", "provenance"),
        ("trust_remote_code", "accepted for TransformerLens"),
    ],
)
def test_fields_sit_in_their_section(field, section):
    assert _field_sections()[field] == section


def test_fields_stay_plain_attributes_that_construct_pickle_and_round_trip():
    for f in dataclasses.fields(HookedTransformerConfig):
        assert not isinstance(inspect.getattr_static(HookedTransformerConfig, f.name, None), property), f.name
    cfg = HookedTransformerConfig(16, 4, 2, 8, act_fn="gelu", n_key_value_heads=2, positional_embedding_type="rotary")
    assert (cfg.d_model, cfg.d_head, cfg.n_layers, cfg.n_ctx, cfg.n_heads) == (16, 4, 2, 8, 4)
    assert "d_model" in vars(cfg) and cfg.uses_grouped_query_attention
    assert pickle.loads(pickle.dumps(cfg)) == cfg
    assert HookedTransformerConfig.from_dict(cfg.to_dict()) == cfg
    assert set(cfg.to_dict()) == {f.name for f in dataclasses.fields(cfg)}


# -- derived facts -----------------------------------------------------------------------------


def _cfg(**kw) -> HookedTransformerConfig:
    return HookedTransformerConfig(**{"d_model": 16, "d_head": 4, "n_layers": 2, "n_ctx": 8, "act_fn": "gelu", **kw})


def test_derived_properties_follow_their_fields():
    assert not _cfg().uses_grouped_query_attention
    assert not _cfg(n_key_value_heads=4).uses_grouped_query_attention  # as many K/V heads as query heads
    assert _cfg(n_key_value_heads=1).uses_grouped_query_attention
    assert _cfg(positional_embedding_type="rotary").uses_rotary and not _cfg().uses_rotary
    assert _cfg(num_experts=4, experts_per_token=2, gated_mlp=True).uses_moe and not _cfg().uses_moe
    assert _cfg().uses_layer_norm and _cfg(normalization_type="LNPre").uses_layer_norm
    assert not _cfg(normalization_type="RMS").uses_layer_norm and not _cfg(normalization_type=None).uses_layer_norm
    sandwich, olmo2 = _cfg(use_normalization_before_and_after=True), _cfg(post_sublayer_norm=True)
    assert sandwich.has_post_sublayer_norms and not sandwich.is_post_norm
    assert olmo2.has_post_sublayer_norms and olmo2.is_post_norm
    named = _cfg(original_architecture=POST_NORM_ARCHITECTURES[0])  # a TransformerLens config: no flag
    assert named.is_post_norm and named.has_post_sublayer_norms
    assert not _cfg().has_post_sublayer_norms and not _cfg().is_post_norm


def test_every_post_norm_question_reads_the_config_property():
    from hooked.analysis.cache_analysis import has_post_sublayer_norms
    from hooked.circuits.graph import heads_are_senders
    from hooked.processing.steps import POST_NORM_ARCHITECTURES as from_steps
    from hooked.processing.steps import skip_reason

    assert from_steps is POST_NORM_ARCHITECTURES  # its old home still exports it
    for cfg in (_cfg(), _cfg(use_normalization_before_and_after=True), _cfg(post_sublayer_norm=True)):
        assert has_post_sublayer_norms(cfg) == cfg.has_post_sublayer_norms
        assert heads_are_senders(cfg) == (not cfg.has_post_sublayer_norms)
        reason, _ = skip_reason(cfg, "fold_ln")
        assert (reason is not None and "post-norm" in reason) == cfg.is_post_norm


# what each tiny family is (the facts), checked against the properties and the modules built from them
GQA = {
    "llama_gqa", "mistral", "qwen2", "qwen3", "olmo3", "gemma2", "gemma3", "gemma3_multimodal", "mixtral",
    "stablelm_qk_norm", "bigcode", "starcoder2", "falcon_new_arch", "falcon_multi_query", "cohere", "phi3",
    "granite", "apertus", "smollm3", "olmo", "gemma", "qwen2_moe", "qwen3_moe", "gpt_oss", "hunyuan", "gemma4",
    "gemma4_multimodal", "gemma3n",
    "glm4_moe", "phimoe", "granitemoe",
}  # fmt: skip
NOT_ROTARY = {"gpt2", "opt", "bloom", "gpt_neo", "bigcode", "mpt", "xglm"}
MOE = {"mixtral", "olmoe", "qwen2_moe", "qwen3_moe", "gpt_oss"}
MOE |= {"deepseek_v2", "deepseek_v3", "glm_moe_dsa", "glm4_moe", "phimoe", "granitemoe"}  # issue 37
POST_NORM = {"olmo2", "olmo3"}
SANDWICH = {"gemma2", "gemma3", "gemma3_multimodal", "gemma4", "gemma4_multimodal", "gemma3n"}
LAYER_NORM = {
    "gpt2", "neox", "phi", "opt", "bloom", "gptj", "gpt_neo", "stablelm_qk_norm", "stablelm_parallel", "bigcode",
    "starcoder2", "falcon_new_arch", "falcon_multi_query", "cohere", "olmo", "mpt", "codegen", "xglm", "phimoe",
}  # fmt: skip


@pytest.fixture(scope="module")
def family_configs():
    from hooked.loading.pretrained import build_config
    from tests.tiny_models import EVERY_FAMILY as FAMILIES

    configs = {}
    for family, build in FAMILIES.items():
        hf = build()
        configs[family] = build_config(hf.config, type(hf).__name__, family)
        del hf
    return configs


def test_derived_properties_state_each_familys_facts(family_configs):
    facts = {
        "uses_grouped_query_attention": GQA,
        "uses_rotary": set(family_configs) - NOT_ROTARY,
        "uses_moe": MOE,
        "is_post_norm": POST_NORM,
        "has_post_sublayer_norms": POST_NORM | SANDWICH,
        "uses_layer_norm": LAYER_NORM,
    }
    for prop, expected in facts.items():
        assert {f for f, cfg in family_configs.items() if getattr(cfg, prop)} == expected, prop


def test_the_modules_built_from_a_config_agree_with_its_properties(family_configs):
    from hooked.components import GroupedQueryAttention, LayerNorm, LayerNormPre
    from hooked.components.post_norm_block import PostNormBlock
    from hooked.models.hooked_transformer import HookedTransformer

    for family, cfg in family_configs.items():
        model = HookedTransformer(cfg, move_to_device=False)
        block = model.blocks[0]
        assert isinstance(block.attn, GroupedQueryAttention) == cfg.uses_grouped_query_attention, family
        assert any(b.attn.rotary for b in model.blocks) == cfg.uses_rotary, family
        assert hasattr(block.mlp, "experts") == cfg.is_moe_layer(0), family  # DeepSeek, GLM: a dense first layer
        assert any(hasattr(b.mlp, "experts") for b in model.blocks) == cfg.uses_moe, family
        assert isinstance(block, PostNormBlock) == cfg.is_post_norm, family
        assert (isinstance(block, PostNormBlock) or hasattr(block, "ln1_post")) == cfg.has_post_sublayer_norms
        assert isinstance(block.ln1, LayerNorm | LayerNormPre) == cfg.uses_layer_norm, family


# -- the architecture registry refuses duplicates --------------------------------------------------


def _fns():
    def config(hf):
        return {}

    def weights(hf, cfg):
        return {}

    return config, weights


def test_registering_a_known_architecture_again_is_refused_and_names_the_converter():
    from hooked.loading import registry

    before = registry.ARCHITECTURES["LlamaForCausalLM"]
    with pytest.raises(DuplicateArchitectureError, match="'LlamaForCausalLM' is already registered.*llama"):
        registry.register_architecture(("FreshTestArchForCausalLM", "LlamaForCausalLM"), *_fns())
    assert registry.ARCHITECTURES["LlamaForCausalLM"] is before
    assert "FreshTestArchForCausalLM" not in registry.ARCHITECTURES  # nothing registered on a refusal
    with pytest.raises(ValueError, match="unregister_architecture"):  # a ValueError, with the way out
        registry.register_model_class_architecture("T5ForConditionalGeneration", "HookedEncoderDecoder", *_fns())
    with pytest.raises(DuplicateArchitectureError, match="'LlamaForCausalLM'"):  # across the two tables
        registry.register_model_class_architecture("LlamaForCausalLM", "HookedEncoder", *_fns())


@pytest.mark.unchecked  # wrong types on purpose: the library's own message is under test, not the shape checker's
def test_a_name_listed_twice_or_a_bare_string_is_refused():
    from hooked.loading import registry

    with pytest.raises(DuplicateArchitectureError, match="'FreshTestArch' is listed twice"):
        registry.register_architecture(("FreshTestArch", "FreshTestArch"), *_fns())
    with pytest.raises(InputTypeError, match="tuple of HF class names"):
        registry.register_architecture("FreshTestArch", *_fns())
    assert "FreshTestArch" not in registry.ARCHITECTURES and "F" not in registry.ARCHITECTURES


def test_unregister_then_register_replaces_a_converter_on_purpose():
    from hooked.loading import registry

    first, second = _fns(), _fns()
    try:
        registry.register_architecture(("FreshTestArchForCausalLM",), *first)
        registry.unregister_architecture("FreshTestArchForCausalLM")
        registry.register_architecture(("FreshTestArchForCausalLM",), *second)
        assert registry.get_architecture("FreshTestArchForCausalLM").config is second[0]
        registry.register_model_class_architecture("FreshTestEncoder", "HookedEncoder", *first)
        registry.unregister_architecture("FreshTestEncoder")
        assert "FreshTestEncoder" not in registry.MODEL_CLASS_ARCHITECTURES
    finally:
        registry.unregister_architecture("FreshTestArchForCausalLM", "FreshTestEncoder")
    assert "FreshTestArchForCausalLM" not in registry.ARCHITECTURES
