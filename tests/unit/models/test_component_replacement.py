"""The contract for replacing and wrapping a model's components in place.

Tools splice modules into a model: a transcoder or wrapper in place of `block.mlp`
(circuit-tracer), an unembed wrapper, an SAE after a hook point, TransformerLens's
per-layer attention buffers shared across layers. These tests pin down what the model
calls, what a replacement may rely on, and where the model refuses clearly.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from hooked import HookedTransformer
from hooked.core.config import HookedTransformerConfig
from hooked.core.errors import HookedError, InputError, ReplacedModuleError
from hooked.core.hook_points import HookPoint


def tiny_model(**overrides) -> HookedTransformer:
    options = dict(
        n_layers=2, d_model=16, n_ctx=12, d_head=4, n_heads=4, d_vocab=40, d_mlp=32, act_fn="gelu",
        normalization_type="RMS", positional_embedding_type="rotary", n_key_value_heads=2,
        use_local_attn=True, attn_types=["global", "local"], window_size=3,
    )  # fmt: skip
    model = HookedTransformer(HookedTransformerConfig(**{**options, **overrides}))
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    return model


TOKENS = torch.tensor([[1, 5, 9, 3, 7, 2, 8, 4], [6, 2, 2, 9, 1, 3, 5, 7]])


class WrappedMLP(nn.Module):
    """A TransformerLens-style wrapper: `forward(self, x)`, its own hook points around the original."""

    def __init__(self, mlp: nn.Module):
        super().__init__()
        self.old_mlp, self.hook_in, self.hook_out = mlp, HookPoint(), HookPoint()

    def forward(self, x):
        return self.hook_out(self.old_mlp(self.hook_in(x)))


class WrappedUnembed(nn.Module):
    def __init__(self, unembed: nn.Module):
        super().__init__()
        self.old_unembed, self.hook_pre = unembed, HookPoint()

    def forward(self, x):  # TransformerLens's signature: no logits_to_keep
        return self.old_unembed(self.hook_pre(x))


def test_tl_style_replacements_of_mlp_unembed_and_norm_are_called_with_one_argument():
    model = tiny_model()
    ref = model(TOKENS)
    # hooked's Unembed projects the last 2 positions alone too: the same rows, the same BLAS product (a
    # slice of the full projection may differ in the last bit: `vocab_projection` and BLAS pick their
    # kernel by the number of rows)
    ref_last = model(TOKENS, logits_to_keep=2)
    for block in model.blocks:
        block.mlp = WrappedMLP(block.mlp)
    model.unembed = WrappedUnembed(model.unembed)
    model.ln_final = nn.Sequential(model.ln_final)  # any module taking x
    model.setup()
    torch.testing.assert_close(model(TOKENS), ref, atol=0, rtol=0)
    last = model(TOKENS, logits_to_keep=2)  # a replacement unembed gets the last positions of the residual
    torch.testing.assert_close(last, ref_last, atol=0, rtol=0)
    torch.testing.assert_close(last, ref[:, -2:], atol=1e-6, rtol=1e-6)  # what a slice of the full logits holds


def test_a_replacements_own_hook_points_are_named_cached_and_hookable_after_setup():
    model = tiny_model()
    for block in model.blocks:
        block.mlp = WrappedMLP(block.mlp)
    model.setup()
    assert {"blocks.0.mlp.hook_in", "blocks.1.mlp.hook_out", "blocks.1.mlp.old_mlp.hook_post"} <= set(model.hook_dict)
    logits, cache = model.run_with_cache(TOKENS)
    torch.testing.assert_close(cache["blocks.1.mlp.hook_out"], cache["blocks.1.hook_mlp_out"], atol=0, rtol=0)
    zeroed = model.run_with_hooks(TOKENS, fwd_hooks=[("blocks.1.mlp.hook_out", lambda x, hook: torch.zeros_like(x))])
    _, zero_cache = model.run_with_cache(TOKENS, names_filter="blocks.1.hook_resid_mid")
    expected = model.unembed(model.ln_final(zero_cache["blocks.1.hook_resid_mid"]))
    torch.testing.assert_close(zeroed, expected, atol=1e-6, rtol=1e-6)
    assert not any(hp.has_hooks() for hp in model.hook_dict.values())  # nothing leaked


def test_backward_hooks_of_a_forward_fire_after_the_hooks_context_closed():
    """As TransformerLens's module backward hooks: bound at forward time (circuit-tracer's attribution)."""
    model = tiny_model()
    grads = []
    with model.hooks(bwd_hooks=[("blocks.0.hook_resid_post", lambda g, hook: grads.append(g.clone()))]):
        logits = model(TOKENS)
    assert not model.blocks[0].hook_resid_post.has_hooks()
    logits[:, -1].sum().backward()
    assert len(grads) == 1 and grads[0].shape == (2, 8, 16) and grads[0].abs().sum() > 0


def test_a_detached_scale_from_a_hook_stops_the_gradient_through_the_norm():
    """An equal-valued but detached `hook_scale` is an edit: the norm becomes linear in its input."""
    model = tiny_model()
    embed = model.embed(TOKENS).detach().requires_grad_(True)  # [batch, pos, d_model]
    norm = model.blocks[0].ln1
    plain = torch.autograd.grad(norm(embed).sum(), embed)[0]
    scale = (embed.detach().pow(2).mean(-1, keepdim=True) + model.cfg.eps).sqrt()  # [batch, pos, 1]
    handle = norm.hook_scale.add_hook(lambda s, hook: s.detach())
    try:
        frozen = torch.autograd.grad(norm(embed).sum(), embed)[0]
    finally:
        handle.hook.remove()
    torch.testing.assert_close(frozen, (norm.w / scale).expand_as(frozen), atol=1e-6, rtol=1e-5)
    assert not torch.allclose(plain, frozen, atol=1e-4)


def test_tl_attention_buffers_have_tl_shapes_and_reading_them_changes_nothing():
    model = tiny_model()
    ref = model(TOKENS)
    attn0, attn1 = model.blocks[0].attn, model.blocks[1].attn
    assert (attn0.attn_type, attn1.attn_type) == ("global", "local")
    n_ctx = model.cfg.n_ctx
    assert attn0.mask.shape == (n_ctx, n_ctx) and attn0.mask.dtype == torch.bool
    assert torch.equal(attn0.mask, torch.ones(n_ctx, n_ctx, dtype=torch.bool).tril())
    assert torch.equal(attn1.mask, torch.ones(n_ctx, n_ctx, dtype=torch.bool).tril().triu(-2))  # window 3
    assert attn0.IGNORE.shape == () and attn0.IGNORE.item() == float("-inf")
    assert attn0.rotary_sin.shape == attn0.rotary_cos.shape == (n_ctx, model.cfg.rotary_dim)
    torch.testing.assert_close(model(TOKENS), ref, atol=1e-6, rtol=1e-6)
    assert not any(k.endswith(("mask", "IGNORE", "rotary_sin", "rotary_cos")) for k in model.state_dict())


def test_assigned_tl_buffers_are_used_by_the_forward_and_del_resets_them():
    model = tiny_model()
    ref = model(TOKENS)
    shared_cos, shared_sin = model.blocks[0].attn.rotary_cos, model.blocks[0].attn.rotary_sin
    for block in model.blocks:  # circuit-tracer's deduplication: one tensor for every layer of a type
        block.attn.rotary_cos, block.attn.rotary_sin = shared_cos, shared_sin
    assert model.blocks[1].attn.rotary_cos is shared_cos
    torch.testing.assert_close(model(TOKENS), ref, atol=1e-6, rtol=1e-6)
    model.blocks[1].attn.mask = model.blocks[0].attn.mask  # the local layer now attends globally
    global_logits = model(TOKENS)
    assert not torch.allclose(global_logits, ref, atol=1e-3)
    reference = tiny_model(use_local_attn=False, attn_types=None)
    torch.testing.assert_close(global_logits, reference(TOKENS), atol=1e-5, rtol=1e-5)
    model.blocks[0].attn.rotary_cos = torch.zeros_like(shared_cos)  # the assigned table is what rotates
    assert not torch.allclose(model(TOKENS), global_logits, atol=1e-3)
    for block in model.blocks:
        del block.attn.mask, block.attn.rotary_cos, block.attn.rotary_sin
    torch.testing.assert_close(model(TOKENS), ref, atol=1e-6, rtol=1e-6)


def test_bad_or_short_tl_buffers_are_refused_with_the_fix():
    model = tiny_model()
    with pytest.raises(InputError, match="must be a tensor"):
        model.blocks[0].attn.mask = [[True]]
    model.blocks[0].attn.mask = torch.ones(4, 4, dtype=torch.bool).tril()
    with pytest.raises(InputError, match="too small for 8 keys.*del attn.mask"):
        model(TOKENS)


def test_weight_views_name_the_replaced_module_that_lacks_a_weight():
    model = tiny_model()
    model.blocks[1].mlp = WrappedMLP(model.blocks[1].mlp)
    with pytest.raises(ReplacedModuleError, match=r"blocks\.1\.mlp is a WrappedMLP, which has no 'W_in'") as info:
        _ = model.W_in
    assert isinstance(info.value, HookedError) and isinstance(info.value, TypeError)  # not swallowed by getattr
    assert model.W_Q.shape == (2, 4, 16, 4)  # untouched components still read


def test_weight_processing_refuses_a_replaced_component():
    model = tiny_model(normalization_type="LN", n_key_value_heads=None, use_local_attn=False, attn_types=None)
    model.blocks[0].mlp = WrappedMLP(model.blocks[0].mlp)
    with pytest.raises(ReplacedModuleError, match=r"blocks\.0\.mlp is a WrappedMLP.*Process the weights before"):
        model.process_weights_()


@pytest.mark.unchecked  # torch.compile: dynamo cannot trace beartype's wrappers
def test_a_compiled_block_runs_in_place_of_the_block():
    model = tiny_model()
    ref = model(TOKENS)
    model.blocks[1] = torch.compile(model.blocks[1], backend="eager")
    torch.testing.assert_close(model(TOKENS), ref, atol=1e-6, rtol=1e-6)


def test_a_standalone_attention_state_dict_carries_tl_buffers_and_a_models_does_not():
    """TransformerLens code copies `attn.state_dict()` (with `mask`, `IGNORE`) between layers."""
    model = tiny_model()
    attn = model.blocks[1].attn
    state = attn.state_dict()
    assert {"mask", "IGNORE", "rotary_sin", "rotary_cos"} <= set(state)
    # taking a state dict (accelerate's dispatch does, per module) leaves the layer on per-call masks
    assert not set(attn._buffers) & {"mask", "IGNORE", "rotary_sin", "rotary_cos"}
    assert not any(k.endswith(("mask", "IGNORE")) for k in model.state_dict())
    other = tiny_model().blocks[1].attn
    other.load_state_dict(state)  # strict: the buffers are taken, equal to the defaults so not stored
    assert "mask" not in other._buffers
    state["mask"] = torch.ones_like(state["mask"])  # a different mask is stored and used
    other.load_state_dict(state)
    assert torch.equal(other.mask, state["mask"])
