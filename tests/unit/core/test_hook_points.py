"""Hook machinery: replacement, in-place edits, contexts, errors, backward hooks, caching options."""

import pytest
import torch

from hooked import HookedTransformer, HookedTransformerConfig, HookNotEnabledError, HookShapeError

CFG = dict(d_model=32, d_head=8, n_layers=2, n_ctx=32, d_vocab=50, act_fn="gelu", seed=0)


@pytest.fixture
def model():
    return HookedTransformer(HookedTransformerConfig(**CFG))


@pytest.fixture
def toks():
    return torch.randint(0, 50, (2, 7), generator=torch.Generator().manual_seed(1))


def test_returned_tensor_replaces_activation(model, toks):
    def zero_head_3(z, hook):
        z = z.clone()
        z[:, :, 3] = 0
        return z

    _, cache = model.run_with_cache(toks, names_filter="blocks.1.attn.hook_z")
    assert cache["z", 1][:, :, 3].abs().sum() > 0
    logits = model.run_with_hooks(toks, fwd_hooks=[("blocks.1.attn.hook_z", zero_head_3)])
    with model.hooks([("blocks.1.attn.hook_z", zero_head_3)]):
        _, cache = model.run_with_cache(toks, names_filter="blocks.1.attn.hook_z")
        again = model(toks)
    assert (cache["z", 1][:, :, 3] == 0).all()
    torch.testing.assert_close(logits, again, atol=0, rtol=0)
    assert not torch.allclose(logits, model(toks))


def test_in_place_edit_without_return(model, toks):
    def double(x, hook):
        x.mul_(2)

    via_return = model.run_with_hooks(toks, fwd_hooks=[("blocks.0.hook_mlp_out", lambda x, hook: x * 2)])
    in_place = model.run_with_hooks(toks, fwd_hooks=[("blocks.0.hook_mlp_out", double)])
    torch.testing.assert_close(in_place, via_return, atol=0, rtol=0)


def test_identity_hooks_and_cache_are_bitwise_transparent(model, toks):
    model.cfg.attn_implementation = "eager"
    plain = model(toks)
    hooked = model.run_with_hooks(toks, fwd_hooks=[(lambda n: True, lambda x, hook: x)])
    cached, _ = model.run_with_cache(toks)
    assert torch.equal(plain, hooked) and torch.equal(plain, cached)


@pytest.mark.parametrize("n_key_value_heads", [None, 2])
def test_run_with_cache_returns_the_plain_forward_logits_on_the_fast_path(toks, n_key_value_heads):
    """Caching only reads patterns, so the output keeps SDPA's values: run_with_cache(x) == model(x) bitwise."""
    cfg = dict(CFG, n_key_value_heads=n_key_value_heads, positional_embedding_type="rotary", n_ctx=8)
    model = HookedTransformer(HookedTransformerConfig(**cfg))
    assert model.cfg.attn_implementation == "auto"
    plain = model(toks)
    cached_logits, cache = model.run_with_cache(toks)
    assert torch.equal(cached_logits, plain)
    model.cfg.attn_implementation = "eager"
    eager_logits, eager_cache = model.run_with_cache(toks)
    for name in ("blocks.0.attn.hook_pattern", "blocks.0.attn.hook_attn_scores"):
        assert torch.equal(cache[name], eager_cache[name])  # the cached pattern is the explicit path's
    # later layers read a residual stream written by SDPA instead: equal up to float rounding
    torch.testing.assert_close(cache["pattern", 1], eager_cache["pattern", 1], atol=1e-6, rtol=0)
    torch.testing.assert_close(eager_logits, plain, atol=1e-5, rtol=0)
    model.cfg.attn_implementation = "auto"
    # a hook that may edit the pattern still takes the explicit path, and its edit counts
    zeroed = model.run_with_hooks(toks, fwd_hooks=[("blocks.1.attn.hook_pattern", lambda p, hook: p * 0)])
    assert not torch.allclose(zeroed, plain)


def test_nested_contexts_remove_only_their_own_hooks(model, toks):
    calls = []
    outer = ("blocks.0.hook_resid_pre", lambda x, hook: calls.append("outer"))
    inner = ("blocks.0.hook_resid_pre", lambda x, hook: calls.append("inner"))
    with model.hooks([outer]):
        with model.hooks([inner]):
            model(toks)
            assert len(model.list_hooks()["blocks.0.hook_resid_pre"]) == 2
        model(toks)
    model(toks)
    assert calls == ["outer", "inner", "outer"]
    assert model.list_hooks() == {}


def test_exception_inside_a_hook_leaves_no_hook_attached(model, toks):
    def boom(x, hook):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        model.run_with_hooks(toks, fwd_hooks=[("blocks.1.hook_resid_mid", boom)])
    with pytest.raises(RuntimeError), model.hooks([("blocks.0.attn.hook_q", lambda x, hook: None)]):
        raise RuntimeError("outside the forward")
    assert model.list_hooks() == {}
    assert model.context_level == 0


def test_wrong_shape_names_hook_and_both_shapes(model, toks):
    with pytest.raises(HookShapeError, match=r"blocks\.0\.hook_resid_pre.*\(2, 7\).*\(2, 7, 32\)"):
        model.run_with_hooks(toks, fwd_hooks=[("blocks.0.hook_resid_pre", lambda x, hook: x[..., 0])])
    assert model.list_hooks() == {}


def test_unknown_name_suggests_close_matches(model, toks):
    with pytest.raises(KeyError, match="blocks.0.hook_resid_pre"):
        model.run_with_hooks(toks, fwd_hooks=[("blocks.0.hook_resid_pr", lambda x, hook: x)])
    with pytest.raises(KeyError, match="blocks.1.attn.hook_pattern"):
        model.run_with_cache(toks, names_filter=["blocks.1.attn.hook_patern"])


def test_disabled_optional_hook_raises_naming_the_flag(model, toks):
    with pytest.raises(HookNotEnabledError, match="use_attn_result"):
        model.add_hook("blocks.0.attn.hook_result", lambda x, hook: x)
    _, cache = model.run_with_cache(toks)
    assert "blocks.0.attn.hook_result" not in cache
    model.set_use_attn_result(True)
    _, cache = model.run_with_cache(toks, names_filter="blocks.0.attn.hook_result")
    assert cache["result", 0].shape == (2, 7, 4, 32)


def test_prepend_permanent_levels_and_ctx(model, toks):
    order = []
    hp = model.blocks[0].hook_resid_pre
    model.add_hook("blocks.0.hook_resid_pre", lambda x, hook: order.append("a"))
    model.add_hook("blocks.0.hook_resid_pre", lambda x, hook: order.append("b"), prepend=True)
    model.add_perma_hook("blocks.0.hook_resid_pre", lambda x, hook: hook.ctx.setdefault("n", []).append(1))
    model(toks)
    assert order == ["b", "a"] and hp.ctx["n"] == [1]
    model.reset_hooks(clear_contexts=False)
    model(toks)
    assert order == ["b", "a"] and hp.ctx["n"] == [1, 1]
    model.reset_hooks()
    assert hp.ctx == {} and hp.has_hooks(including_permanent=True)
    model.reset_hooks(including_permanent=True)
    assert not hp.has_hooks()
    assert hp.layer() == 0 and model.blocks[1].attn.hook_z.layer() == 1
    with pytest.raises(ValueError):
        model.hook_embed.layer()


def test_backward_hooks_and_incl_bwd_equal_autograd(model, toks):
    grads = {}
    model.add_hook("blocks.0.hook_resid_mid", lambda g, hook: grads.__setitem__("mid", g.clone()), dir="bwd")
    loss, cache = model.run_with_cache(
        toks, return_type="loss", incl_bwd=True, names_filter=["blocks.0.hook_resid_mid"]
    )
    model.reset_hooks()
    # reference: plain autograd on the same activation
    saved = {}
    model.add_hook("blocks.0.hook_resid_mid", lambda x, hook: saved.__setitem__("x", x) or x.retain_grad())
    ref_loss = model(toks, return_type="loss")
    ref_loss.backward()
    model.reset_hooks()
    torch.testing.assert_close(loss, ref_loss, atol=0, rtol=0)
    torch.testing.assert_close(cache["blocks.0.hook_resid_mid_grad"], saved["x"].grad, atol=0, rtol=0)
    torch.testing.assert_close(grads["mid"], saved["x"].grad, atol=0, rtol=0)


def test_backward_hook_can_replace_the_gradient(model, toks):
    model.zero_grad()
    model.run_with_hooks(
        toks, return_type="loss", bwd_hooks=[("hook_embed", lambda g, hook: torch.zeros_like(g))], reset_hooks_end=False
    ).backward()
    model.reset_hooks()
    assert model.embed.W_E.grad.abs().sum() == 0


def test_pos_slice_keeps_axis_and_uses_query_axis_for_patterns(model, toks):
    _, full = model.run_with_cache(toks)
    _, last = model.run_with_cache(toks, pos_slice=-1)
    _, span = model.run_with_cache(toks, pos_slice=(1, 4))
    _, fancy = model.run_with_cache(toks, pos_slice=[0, 2])
    assert last["resid_pre", 0].shape == (2, 1, 32)
    torch.testing.assert_close(last["resid_pre", 0], full["resid_pre", 0][:, -1:], atol=0, rtol=0)
    torch.testing.assert_close(span["pattern", 1], full["pattern", 1][:, :, 1:4], atol=0, rtol=0)
    torch.testing.assert_close(fancy["z", 0], full["z", 0][:, [0, 2]], atol=0, rtol=0)
    torch.testing.assert_close(last["scale"], full["scale"][:, -1:], atol=0, rtol=0)


def test_names_filter_forms_device_and_remove_batch_dim(model, toks):
    _, one = model.run_with_cache(toks, names_filter="hook_embed")
    _, lst = model.run_with_cache(toks, names_filter=["hook_embed", "blocks.1.hook_resid_post"])
    _, fn = model.run_with_cache(toks, names_filter=lambda n: n.endswith("hook_q"))
    _, everything = model.run_with_cache(toks)
    assert list(one.keys()) == ["hook_embed"]
    assert set(lst.keys()) == {"hook_embed", "blocks.1.hook_resid_post"}
    assert set(fn.keys()) == {"blocks.0.attn.hook_q", "blocks.1.attn.hook_q"}
    assert len(everything) == sum(model.is_active(hp) for hp in model.hook_points())
    _, single = model.run_with_cache(toks[:1], remove_batch_dim=True, device="cpu")
    assert single["resid_post", 1].shape == (7, 32) and not single.has_batch_dim
    with pytest.raises(ValueError, match="batch size 1"):
        model.run_with_cache(toks, remove_batch_dim=True)
    _, raw = model.run_with_cache(toks, return_cache_object=False, names_filter="hook_embed")
    assert isinstance(raw, dict)


def test_caching_records_post_intervention_values_unless_prepended(model, toks):
    model.add_hook("blocks.0.hook_resid_post", lambda x, hook: x * 0)
    _, after = model.run_with_cache(toks, names_filter="blocks.0.hook_resid_post")
    before = model.add_caching_hooks("blocks.0.hook_resid_post", prepend=True)
    model(toks)
    model.reset_hooks()
    assert (after["resid_post", 0] == 0).all()
    assert before["blocks.0.hook_resid_post"].abs().sum() > 0


# -- errors that name the fix -----------------------------------------------------------------


def test_unknown_hook_suggestions_list_the_right_layer_first_and_few():
    deep = HookedTransformer(HookedTransformerConfig(**dict(CFG, d_model=8, d_head=4, n_layers=21)))
    with pytest.raises(KeyError) as info:
        deep.run_with_cache(torch.zeros(1, 3, dtype=torch.long), names_filter="blocks.0.attn.hook_patern")
    suggested = str(info.value).split("Did you mean: ")[1].split("?")[0].split(", ")
    assert suggested[0] == "blocks.0.attn.hook_pattern"
    assert len(suggested) <= 4


def test_attn_in_on_grouped_query_attention_points_to_split_qkv_input():
    from hooked.core.errors import InputError

    gqa = HookedTransformer(
        HookedTransformerConfig(**dict(CFG, n_key_value_heads=2, positional_embedding_type="rotary"))
    )
    toks = torch.randint(0, 50, (1, 5), generator=torch.Generator().manual_seed(0))
    with pytest.raises(HookNotEnabledError, match=r"set_use_split_qkv_input\(True\)"):
        gqa.run_with_cache(toks, names_filter="blocks.0.hook_attn_in")
    with pytest.raises(InputError, match=r"set_use_split_qkv_input\(True\)"):
        gqa.set_use_attn_in(True)
    gqa.set_use_split_qkv_input(True)  # the suggested fix works and gives the documented shapes
    _, cache = gqa.run_with_cache(toks, names_filter=lambda n: n.startswith("blocks.0.hook_") and n.endswith("_input"))
    assert cache["blocks.0.hook_q_input"].shape == (1, 5, 4, 32)
    assert cache["blocks.0.hook_k_input"].shape == (1, 5, 2, 32)


def test_incl_bwd_with_autograd_off_says_how_to_enable_it(model, toks):
    from hooked.core.errors import InputError

    previous = torch.is_grad_enabled()
    torch.set_grad_enabled(False)  # as ARENA notebooks start
    try:
        with pytest.raises(InputError, match=r"torch\.enable_grad\(\)"):
            model.run_with_cache(toks, return_type="loss", incl_bwd=True)
    finally:
        torch.set_grad_enabled(previous)
    assert not any(hp.has_hooks() for hp in model.hook_points())  # nothing leaked
    with torch.enable_grad():
        _, cache = model.run_with_cache(toks, return_type="loss", incl_bwd=True, names_filter="blocks.0.hook_resid_mid")
    assert cache["blocks.0.hook_resid_mid_grad"].abs().sum() > 0


def test_partial_forward_hooks_and_backward_hooks_added_by_name(model, toks):
    from functools import partial

    def scale(x, hook, factor):
        return x * factor

    def save_grad(grad, hook, store):
        store[hook.name] = grad.detach().clone()

    via_partial = model.run_with_hooks(toks, fwd_hooks=[("blocks.0.hook_mlp_out", partial(scale, factor=3.0))])
    via_lambda = model.run_with_hooks(toks, fwd_hooks=[("blocks.0.hook_mlp_out", lambda x, hook: x * 3.0)])
    torch.testing.assert_close(via_partial, via_lambda, atol=0, rtol=0)
    grads = {}
    model.add_hook("blocks.1.hook_resid_pre", partial(save_grad, store=grads), "bwd")
    try:
        model(toks, return_type="loss").backward()
    finally:
        model.reset_hooks()
    _, cache = model.run_with_cache(toks, return_type="loss", incl_bwd=True, names_filter="blocks.1.hook_resid_pre")
    torch.testing.assert_close(grads["blocks.1.hook_resid_pre"], cache["blocks.1.hook_resid_pre_grad"], atol=0, rtol=0)
