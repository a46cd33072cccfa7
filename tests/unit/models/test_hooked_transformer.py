"""HookedTransformer: inputs, return types, layer ranges, optional hooks, block variants, state dicts."""

import pytest
import torch

from hooked import HookedTransformer, HookedTransformerConfig

BASE = dict(d_model=32, d_head=8, n_layers=2, n_ctx=32, d_vocab=60, act_fn="gelu_new", seed=0)


def make(**overrides):
    cfg = dict(BASE)
    cfg.update(overrides)
    return HookedTransformer(HookedTransformerConfig(**cfg))


def toks(batch=2, pos=6):
    return torch.randint(0, 60, (batch, pos), generator=torch.Generator().manual_seed(0))


def test_return_types_and_token_shapes():
    model, t = make(), toks()
    logits = model(t)
    assert logits.shape == (2, 6, 60)
    assert model(t[0]).shape == (1, 6, 60)
    loss = model(t, return_type="loss")
    per_token = model(t, return_type="loss", loss_per_token=True)
    both = model(t, return_type="both")
    assert loss.ndim == 0 and per_token.shape == (2, 5)
    torch.testing.assert_close(both.logits, logits, atol=0, rtol=0)
    torch.testing.assert_close(both.loss, loss, atol=0, rtol=0)
    torch.testing.assert_close(per_token.mean(), loss, atol=1e-6, rtol=0)
    assert model(t, return_type=None) is None
    with pytest.raises(ValueError, match="return_type"):
        model(t, return_type="probs")


def test_embeddings_input_and_layer_ranges():
    model, t = make(n_layers=3), toks()
    # not caching patterns keeps the SDPA path, so the cached run is bitwise the plain one
    logits, cache = model.run_with_cache(t, names_filter=lambda n: "attn" not in n)
    torch.testing.assert_close(model(cache["hook_embed"]), logits, atol=1e-6, rtol=0)
    resid = model(t, stop_at_layer=2)
    torch.testing.assert_close(resid, cache["resid_pre", 2], atol=0, rtol=0)
    torch.testing.assert_close(model(t, stop_at_layer=0), cache["resid_pre", 0], atol=0, rtol=0)
    torch.testing.assert_close(model(t, stop_at_layer=-1), cache["resid_pre", 2], atol=0, rtol=0)
    torch.testing.assert_close(model(resid, start_at_layer=2), logits, atol=1e-6, rtol=0)
    torch.testing.assert_close(
        model(cache["resid_pre", 1], start_at_layer=1, stop_at_layer=2), resid, atol=1e-6, rtol=0
    )
    loss = model(resid, start_at_layer=2, tokens=t, return_type="loss")
    torch.testing.assert_close(loss, model(t, return_type="loss"), atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="tokens"):
        model(resid, start_at_layer=2, return_type="loss")


@pytest.mark.parametrize(
    "variant",
    [
        dict(),
        dict(parallel_attn_mlp=True),
        dict(attn_only=True, act_fn=None),
        dict(normalization_type="RMS"),
        dict(normalization_type=None),
        dict(gated_mlp=True, act_fn="silu"),
        dict(act_fn="solu_ln"),
    ],
)
def test_block_variants_fire_every_hook_exactly_once(variant):
    model, t = make(**variant), toks()
    counts = {}
    model.add_hook(lambda n: True, lambda x, hook: counts.__setitem__(hook.name, counts.get(hook.name, 0) + 1))
    model(t)
    model.reset_hooks()
    active = [n for n, hp in model.hook_dict.items() if model.is_active(hp)]
    assert sorted(counts) == sorted(active)
    assert set(counts.values()) == {1}
    has_mid = "blocks.0.hook_resid_mid" in model.hook_dict
    assert has_mid == (not model.cfg.attn_only and not model.cfg.parallel_attn_mlp)


def test_parallel_block_adds_both_sublayers_to_resid_pre():
    model, t = make(parallel_attn_mlp=True), toks()
    _, c = model.run_with_cache(t)
    torch.testing.assert_close(
        c["resid_post", 0], c["resid_pre", 0] + c["attn_out", 0] + c["mlp_out", 0], atol=1e-6, rtol=0
    )


def test_optional_hooks_have_documented_shapes_and_keep_outputs():
    model, t = make(n_key_value_heads=None), toks()
    ref = model(t)
    for setter in ("set_use_attn_result", "set_use_split_qkv_input", "set_use_hook_mlp_in"):
        getattr(model, setter)(True)
    model.cfg.use_hook_tokens = True
    logits, c = model.run_with_cache(t)
    torch.testing.assert_close(logits, ref, atol=1e-5, rtol=0)
    assert c["hook_tokens"].shape == (2, 6)
    assert c["result", 0].shape == (2, 6, 4, 32)
    assert c["blocks.0.hook_q_input"].shape == (2, 6, 4, 32)
    assert c["blocks.0.ln1.hook_scale"].shape == (2, 6, 12, 1)  # q, k, v streams normalized in one call
    assert c["blocks.0.hook_mlp_in"].shape == (2, 6, 32)
    torch.testing.assert_close(c["result", 0].sum(2) + model.blocks[0].attn.b_O, c["attn_out", 0], atol=1e-5, rtol=0)
    model.set_use_split_qkv_input(False)
    model.set_use_attn_in(True)
    logits, c = model.run_with_cache(t)
    torch.testing.assert_close(logits, ref, atol=1e-5, rtol=0)
    assert c["blocks.1.hook_attn_in"].shape == (2, 6, 4, 32) and c["blocks.1.ln1.hook_normalized"].shape == (
        2,
        6,
        4,
        32,
    )


def test_split_qkv_input_hook_edits_only_its_stream():
    model, t = make(), toks()
    model.set_use_split_qkv_input(True)

    def shift_v_head0(x, hook):
        x[:, :, 0] += torch.linspace(-1, 1, x.shape[-1])

    _, base = model.run_with_cache(t)
    with model.hooks([("blocks.0.hook_v_input", shift_v_head0)]):
        _, edited = model.run_with_cache(t)
    torch.testing.assert_close(edited["q", 0], base["q", 0], atol=0, rtol=0)
    torch.testing.assert_close(edited["k", 0], base["k", 0], atol=0, rtol=0)
    torch.testing.assert_close(edited["v", 0][:, :, 1:], base["v", 0][:, :, 1:], atol=0, rtol=0)
    assert not torch.allclose(edited["v", 0][:, :, 0], base["v", 0][:, :, 0])


def test_hook_shapes_match_spec():
    model, t = make(), toks()
    _, c = model.run_with_cache(t)
    b, p, d, H, dh = 2, 6, 32, 4, 8
    expected = {
        "hook_embed": (b, p, d),
        "hook_pos_embed": (b, p, d),
        "blocks.0.hook_resid_pre": (b, p, d),
        "blocks.0.ln1.hook_scale": (b, p, 1),
        "blocks.0.ln1.hook_normalized": (b, p, d),
        "blocks.0.attn.hook_q": (b, p, H, dh),
        "blocks.0.attn.hook_k": (b, p, H, dh),
        "blocks.0.attn.hook_attn_scores": (b, H, p, p),
        "blocks.0.attn.hook_pattern": (b, H, p, p),
        "blocks.0.attn.hook_z": (b, p, H, dh),
        "blocks.0.hook_attn_out": (b, p, d),
        "blocks.0.hook_resid_mid": (b, p, d),
        "blocks.0.mlp.hook_pre": (b, p, 4 * d),
        "blocks.0.mlp.hook_post": (b, p, 4 * d),
        "blocks.0.hook_mlp_out": (b, p, d),
        "blocks.0.hook_resid_post": (b, p, d),
        "ln_final.hook_scale": (b, p, 1),
        "unembed.hook_in": (b, p, d),
        "unembed.hook_out": (b, p, 60),
    }
    for name, shape in expected.items():
        assert tuple(c[name].shape) == shape, name
    assert torch.isinf(c["attn_scores", 0][0, 0, 0, 1]) and c["pattern", 0][0, 0, 0, 1] == 0


def test_tl_state_dict_round_trip_drops_legacy_buffers_and_unties():
    src, dst = make(seed=1), make(seed=2)
    sd = dict(src.state_dict())
    sd["blocks.0.attn.mask"] = torch.ones(32, 32).tril().bool()
    sd["blocks.0.attn.IGNORE"] = torch.tensor(-1e5)
    dst.load_state_dict(sd)
    torch.testing.assert_close(dst(toks()), src(toks()), atol=0, rtol=0)
    # tie dst's embeddings, then load a checkpoint with a different W_U: it must untie
    dst.unembed.W_U = torch.nn.Parameter(dst.embed.W_E.T)
    assert dst.embeddings_tied()
    dst.load_state_dict(src.state_dict())
    assert not dst.embeddings_tied()
    torch.testing.assert_close(dst.W_U, src.W_U, atol=0, rtol=0)
    torch.testing.assert_close(dst.W_E, src.W_E, atol=0, rtol=0)


def test_config_validation_errors_name_the_field():
    with pytest.raises(AssertionError, match="act_fn"):
        HookedTransformerConfig(d_model=32, d_head=8, n_layers=1, n_ctx=8)
    with pytest.raises(AssertionError, match="n_key_value_heads"):
        HookedTransformerConfig(d_model=32, d_head=8, n_layers=1, n_ctx=8, act_fn="relu", n_key_value_heads=3)
    with pytest.raises(AssertionError, match="normalization_type"):
        HookedTransformerConfig(d_model=32, d_head=8, n_layers=1, n_ctx=8, act_fn="relu", normalization_type="BN")
    cfg = HookedTransformerConfig(d_model=32, d_head=8, n_layers=1, n_ctx=8, act_fn="relu")
    assert (cfg.n_heads, cfg.d_mlp, cfg.attn_scale) == (4, 128, 8**0.5)
    assert HookedTransformerConfig.from_dict(cfg.to_dict()) == cfg
    legacy = dict(cfg.to_dict(), use_NTK_by_parts_rope=True, NTK_by_parts_factor=32.0)
    assert HookedTransformerConfig.from_dict(legacy).rotary_scaling["factor"] == 32.0


def test_learned_positions_past_n_ctx_raise():
    model = make(n_ctx=8)
    with pytest.raises(ValueError, match="n_ctx"):
        model(torch.zeros(1, 9, dtype=torch.long))


@pytest.mark.parametrize("pos_type", ["standard", "shortformer", "rotary"])
def test_get_residual_matches_forward_resid_pre(pos_type):
    model, t = make(positional_embedding_type=pos_type), toks(pos=7)
    mask = torch.ones_like(t)
    mask[0, :3] = 0  # row 0 left-padded: its positions count real tokens only
    _, cache = model.run_with_cache(t, attention_mask=mask, names_filter=["hook_embed", "blocks.0.hook_resid_pre"])
    residual, shortformer = model.get_residual(cache["hook_embed"], attention_mask=mask)
    torch.testing.assert_close(residual, cache["resid_pre", 0], atol=0, rtol=0)
    assert (shortformer is not None) == (pos_type == "shortformer")
    # the last 2 positions with 5 already processed: same positions as in the full run
    tail = model.get_residual(
        cache["hook_embed"][:, 5:], pos_offset=5, attention_mask=mask, return_shortformer_pos_embed=False
    )
    torch.testing.assert_close(tail, cache["resid_pre", 0][:, 5:], atol=0, rtol=0)
    if pos_type == "standard":
        offset = model.get_residual(cache["hook_embed"][:1, 3:], pos_offset=0, return_shortformer_pos_embed=False)
        torch.testing.assert_close(offset, cache["resid_pre", 0][:1, 3:], atol=0, rtol=0)


def test_logits_to_keep_unembeds_only_the_last_positions():
    model, t = make(), toks(pos=7)
    full = model(t)
    torch.testing.assert_close(model(t, logits_to_keep=2), full[:, -2:], atol=1e-6, rtol=0)
    # hooks see the same activations whatever is kept: every position, unembed.hook_out included
    names = ["ln_final.hook_normalized", "unembed.hook_in", "unembed.hook_out"]
    kept, cache = model.run_with_cache(t, logits_to_keep=2, names_filter=names)
    _, reference = model.run_with_cache(t, names_filter=names)
    torch.testing.assert_close(kept, full[:, -2:], atol=1e-6, rtol=0)
    for name in names:
        torch.testing.assert_close(cache[name], reference[name], atol=0, rtol=0)
    with pytest.raises(ValueError, match="logits_to_keep"):
        model(t, return_type="loss", logits_to_keep=1)
