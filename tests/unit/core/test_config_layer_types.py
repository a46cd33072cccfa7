"""`cfg.layer_types`: a hybrid is a list of token mixers; the derived facts and the refusals."""

from __future__ import annotations

import pytest

from hooked.core.config import HookedTransformerConfig
from hooked.core.errors import ConfigError

BASE = dict(d_model=16, d_head=4, n_layers=3, n_ctx=8, act_fn="silu", gated_mlp=True)
MAMBA2 = dict(ssm_d_state=8, ssm_d_inner=32, ssm_n_heads=4)


def test_a_transformer_is_attention_everywhere():
    cfg = HookedTransformerConfig(**BASE)
    assert cfg.mixer_types == ["attention"] * 3 and cfg.attention_layers == [0, 1, 2] and cfg.recurrent_layers == []
    assert cfg.block_writes(0) == ("attn_out", "mlp_out")
    assert HookedTransformerConfig(**BASE, attn_only=True).block_writes(0) == ("attn_out",)


def test_a_hybrid_is_a_list_of_layer_types():
    cfg = HookedTransformerConfig(**BASE, **MAMBA2, layer_types=["mamba2", "attention", "mamba2"])
    assert cfg.attention_layers == [1] and cfg.recurrent_layers == [0, 2]
    assert [cfg.block_writes(layer) for layer in range(3)] == [
        ("mixer_out", "mlp_out"), ("attn_out", "mlp_out"), ("mixer_out", "mlp_out")
    ]  # fmt: skip


def test_single_sublayer_blocks_hold_a_mixer_or_an_mlp():
    cfg = HookedTransformerConfig(
        **BASE, **MAMBA2, layer_types=["mamba2", "mlp", "attention"], single_sublayer_blocks=True
    )
    assert [cfg.block_writes(layer) for layer in range(3)] == [("mixer_out",), ("mlp_out",), ("attn_out",)]
    assert [cfg.block_has_mlp(layer) for layer in range(3)] == [False, True, False]
    no_mlps = dict(BASE, act_fn=None, n_layers=2)
    assert (
        HookedTransformerConfig(**no_mlps, **MAMBA2, layer_types=["mamba2"] * 2, single_sublayer_blocks=True).d_mlp
        is None
    )


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (dict(layer_types=["mamba2", "transformer", "attention"]), "must name one of"),
        (dict(layer_types=["mamba2", "attention"]), "must name one of"),  # too short
        (dict(layer_types=["mlp", "attention", "attention"]), "single_sublayer_blocks"),
        (dict(layer_types=["gated_deltanet", "attention", "attention"]), "deltanet_n_key_heads"),
        (dict(layer_types=["mamba", "attention", "attention"]), "ssm_dt_rank"),
        (dict(layer_types=["attention"] * 3, parallel_attn_mlp=True), "parallel_attn_mlp"),
        (dict(layer_types=["mamba2", "attention", "attention"], layer_scalar=True), "layer_scalar"),  # Gemma 4's
        (dict(layer_types=["mamba2", "attention", "attention"], kv_shared_from=[None, None, 1]), "kv_shared_from"),
        (dict(single_sublayer_blocks=True), "needs layer_types"),
    ],
)
def test_impossible_layer_types_are_refused(fields, message):
    with pytest.raises(ConfigError, match=message):
        HookedTransformerConfig(**BASE, **MAMBA2, **fields)


def test_per_layer_shapes_reach_a_hybrids_blocks():
    """A hybrid block is built from `cfg.layer_config(layer)`, as a transformer block: its own MLP width."""
    from hooked.components.hybrid_block import HybridBlock

    cfg = HookedTransformerConfig(
        **BASE, **MAMBA2, layer_types=["mamba2", "attention", "mamba2"], layer_d_mlp=[8, 16, 24]
    )
    assert [HybridBlock(cfg, layer).mlp.W_in.shape[-1] for layer in range(3)] == [8, 16, 24]


def test_a_longer_list_is_cut_to_the_layers_kept():
    cfg = HookedTransformerConfig(**dict(BASE, n_layers=2), **MAMBA2, layer_types=["mamba2", "attention", "mamba2"])
    assert cfg.layer_types == ["mamba2", "attention"]


def test_a_hybrid_config_is_strict_json():
    """`hooked serve` sends the config as JSON (no NaN or Infinity): HF's unbounded step limit is None here."""
    import json

    cfg = HookedTransformerConfig(**BASE, **MAMBA2, layer_types=["mamba2"] * 3, ssm_dt_limit=(0.001, float("inf")))
    assert cfg.ssm_dt_limit == (0.001, None)
    sent = json.loads(json.dumps(cfg.to_dict(), allow_nan=False, default=str))
    assert HookedTransformerConfig(
        **BASE, **MAMBA2, layer_types=sent["layer_types"], ssm_dt_limit=sent["ssm_dt_limit"]
    ).ssm_dt_limit == (0.001, None)
