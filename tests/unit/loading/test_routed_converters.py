"""The issue-37 converters: what each maps, and the HF config values each refuses (`hooked.loading.config_checks`)."""

from __future__ import annotations

import pytest

from hooked.core.errors import UnsupportedConfigError
from hooked.loading import get_architecture
from tests.tiny_models import ROUTED_CONFIGS, tiny_routed

pytestmark = pytest.mark.unchecked  # HF config objects go through the converters as they are


def _config(name: str, **changes):
    """The HF config of `ROUTED_CONFIGS[name]` with `changes` (no model is built)."""
    import transformers

    prefix, overrides = ROUTED_CONFIGS[name]
    fields = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, vocab_size=96, num_attention_heads=4)
    return getattr(transformers, prefix + "Config")(**{**fields, **overrides, **changes})


def _convert(name: str, **changes) -> dict:
    hf = _config(name, **changes)
    return get_architecture(hf.architectures[0] if hf.architectures else _class(name)).config(hf)


def _class(name: str) -> str:
    return ROUTED_CONFIGS[name][0] + "ForCausalLM"


#: HF's PhiMoE LongRoPE: the short factors at every length; loads when both cos/sin scales are equal (Phi-3.5-MoE)
PHIMOE_LONGROPE = dict(
    rope_type="longrope",
    rope_theta=1e4,
    short_factor=[1.0, 1.5, 2.0, 3.0],
    long_factor=[2.0, 3.0, 5.0, 9.0],
    original_max_position_embeddings=8,
    short_mscale=1.2,
    long_mscale=1.2,
)

REFUSED = [
    ("deepseek_v2_group_limited", dict(topk_method="noaux_tc"), "topk_method='noaux_tc'"),
    ("deepseek_v2_group_limited", dict(mlp_bias=True), "mlp_bias=True"),
    ("deepseek_v3_group_limited", dict(num_key_value_heads=2), "num_key_value_heads=2"),
    (
        "deepseek_v3_group_limited",
        dict(
            rope_parameters=dict(
                rope_type="llama3",
                factor=8.0,
                rope_theta=1e4,
                low_freq_factor=1.0,
                high_freq_factor=4.0,
                original_max_position_embeddings=8,
            )
        ),
        "'llama3'",
    ),
    (
        "glm_moe_dsa_topk4",
        dict(layer_types=["indexed_attention", "full_attention", "indexed_attention"]),
        "layer_types",
    ),
    (
        "glm4_moe_qk_norm_groups",
        dict(rope_parameters=dict(rope_type="dynamic", factor=2.0, rope_theta=1e4)),
        "'dynamic'",
    ),
    ("phimoe_sparsemixer", dict(num_experts_per_tok=3), "num_experts_per_tok=3"),
    ("phimoe_sparsemixer", dict(rope_parameters=dict(PHIMOE_LONGROPE, long_mscale=1.3)), r"long_mscale'\]=1.3"),
    (
        "granitemoe_multipliers",
        dict(rope_parameters=dict(rope_type="dynamic", factor=2.0, rope_theta=1e4)),
        "'dynamic'",
    ),
]


@pytest.mark.parametrize(("name", "changes", "field"), REFUSED, ids=[f"{n}-{f}" for n, _, f in REFUSED])
def test_a_config_value_the_converter_does_not_implement_is_refused_by_name(name, changes, field):
    _convert(name)  # the family's own config converts
    with pytest.raises(UnsupportedConfigError, match=rf"{_class(name)}: config\.\S*{field}"):
        _convert(name, **changes)


def test_deepseek_fields():
    v2, v3 = _convert("deepseek_v2_group_limited"), _convert("deepseek_v3_group_limited")
    assert (v2["d_head"], v2["d_head_v"], v2["rotary_dim"], v2["kv_lora_rank"], v2["q_lora_rank"]) == (12, 6, 4, 16, 24)
    assert (v2["router_scoring"], v2["router_groups"], v2["router_topk_groups"]) == ("softmax", 2, 1)
    assert v2["rotary_adjacent_pairs"] and v2["rotary_in_fp32"] and not v2["norm_topk_prob"]
    assert (v3["router_scoring"], v3["router_groups"], v3["router_topk_groups"]) == ("sigmoid", 4, 2)
    assert v3["rotary_interleaved_input"] and v3["routed_scaling_factor"] == 2.5 and v3["norm_topk_prob"]
    assert v3["dense_mlp_layers"] == [0] and (v3["d_mlp"], v3["shared_expert_d_mlp"]) == (24, 24)
    assert v3["layer_d_mlp"] == [64] + [24] * (len(v3["layer_d_mlp"]) - 1)  # the dense layer, then the experts
    assert _convert("deepseek_v2_lite_yarn")["q_lora_rank"] is None
    assert _convert("deepseek_v3_group_limited", rope_interleave=False)["rotary_interleaved_input"] is False


def test_deepseek_attention_scale_includes_yarns_mscale():
    """HF's `yarn_apply_mscale`: `d_head^-0.5 * (0.1 * mscale_all_dim * ln(factor) + 1)^2`."""
    import math

    v3 = _convert("deepseek_v3_group_limited")  # factor 4, mscale_all_dim 0.9
    expected = 12**-0.5 * (0.1 * 0.9 * math.log(4.0) + 1.0) ** 2
    assert math.isclose(1 / v3["attn_scale"], expected, rel_tol=1e-12)


def test_glm_and_dsa_fields():
    dsa, glm4 = _convert("glm_moe_dsa_topk4"), _convert("glm4_moe_qk_norm_groups")
    assert (dsa["index_n_heads"], dsa["index_d_head"], dsa["index_topk"], dsa["index_shared_layers"]) == (8, 8, 4, [1])
    assert dsa["dense_mlp_layers"] == [0] and dsa["rotary_interleaved_input"]
    assert glm4["rotary_dim"] == 4 and glm4["use_qk_norm"] and glm4["n_key_value_heads"] == 2  # half of d_head 8


def test_granitemoe_folds_its_multipliers_into_every_writer():
    from tests.tiny_models import hooked_from

    hf = tiny_routed("granitemoe_multipliers")
    model = hooked_from(hf)
    down = hf.model.layers[0].block_sparse_moe.experts.down_proj[1]  # expert 1's [d_model, d_mlp]
    assert (model.blocks[0].mlp.experts[1].W_out.weight == down * 0.5).all()
    assert (hf.model.embed_tokens.weight * 3.0 == model.W_E).all()


def test_phimoe_longrope_with_one_scale_matches_hf_past_the_original_length():
    """HF's PhiMoE rotates with the short factors at every length and scales cos/sin by the (equal) mscales."""
    import torch

    from tests.helpers import max_abs
    from tests.tiny_models import hooked_from, tokens

    hf = tiny_routed("phimoe_sparsemixer", seed=2, rope_parameters=PHIMOE_LONGROPE)
    model, t = hooked_from(hf), tokens()  # 12 positions > original_max_position_embeddings 8
    assert model.cfg.rotary_scaling["attention_factor"] == 1.2
    with torch.no_grad():
        assert max_abs(model(t), hf(t).logits) <= 1e-5
