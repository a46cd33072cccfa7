"""Every hook point, block and component of a `hooked` model through nnsight's tracing (`NNsight(model)`).

Each value saved through nnsight must equal what `run_with_cache` records, and each edit
through nnsight must give the logits of the same edit through `run_with_hooks`.
"""

from __future__ import annotations

import nnsight  # noqa: E402  (dev extra)
import pytest
import torch

from tests.tiny_models import tiny_hooked

FAMILIES = ["gpt2", "llama_gqa", "gemma_post_norm", "moe"]
# the optional hook points: hook_attn_in and the split q/k/v inputs exclude each other
FLAG_SETS = {
    "plain": {},
    "split_inputs": dict(use_attn_result=True, use_split_qkv_input=True, use_hook_mlp_in=True, use_hook_tokens=True),
    "attn_in": dict(use_attn_in=True),
}
TOKENS = torch.randint(0, 50, (2, 6), generator=torch.Generator().manual_seed(0))


def model_with(family: str, flags: dict):
    model = tiny_hooked(family).eval()
    for flag, value in flags.items():
        setattr(model.cfg, flag, value)
    return model


def envoy_at(root, name: str):
    """The nnsight envoy of the module at dotted `name` (`blocks.0.attn.hook_z`)."""
    envoy = root
    for part in name.split("."):
        envoy = envoy[int(part)] if part.isdigit() else getattr(envoy, part)
    return envoy


def firing_order(model, tokens) -> list[str]:
    """The active hook points in the order a forward pass reaches them."""
    fired: list[str] = []
    hooks = [(n, lambda x, hook: fired.append(hook.name)) for n, hp in model.hook_dict.items() if model.is_active(hp)]
    model.run_with_hooks(tokens, fwd_hooks=hooks)
    return fired


@pytest.mark.parametrize("flags", list(FLAG_SETS), ids=list(FLAG_SETS))
@pytest.mark.parametrize("family", FAMILIES)
def test_every_hook_point_saved_in_one_trace(family, flags):
    model = model_with(family, FLAG_SETS[flags])
    logits, cache = model.run_with_cache(TOKENS)
    order = firing_order(model, TOKENS)
    assert set(order) == {n for n, hp in model.hook_dict.items() if model.is_active(hp)}
    nm = nnsight.NNsight(model)
    with torch.no_grad(), nm.trace(TOKENS) as tracer:
        saved = nnsight.save({})  # only names bound to a saved object leave the block
        for name in order:
            saved[name] = envoy_at(nm, name).output
        out = tracer.result.save()
    torch.testing.assert_close(out, logits, rtol=0, atol=1e-5)
    for name in order:
        torch.testing.assert_close(saved[name], cache[name], rtol=0, atol=1e-5, msg=lambda m, n=name: f"{n}: {m}")


# the hook points a fused path skips unless something observes them (norm kernels, SDPA, MoE routing, unembed)
FUSED = ("hook_scale", "hook_normalized", "hook_attn_scores", "hook_pattern", "hook_expert_weights", "hook_out")


@pytest.mark.parametrize("family", FAMILIES)
def test_each_fused_path_hook_point_alone(family):
    """One trace per hook point that a fused kernel skips: watched on its own, it is computed in
    execution order (the explicit path runs for it alone)."""
    check_alone(model_with(family, {}), lambda name: name.endswith(FUSED))


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_each_hook_point_alone(family):
    """One trace per hook point, every hook point."""
    check_alone(model_with(family, {}), lambda name: True)


def check_alone(model, select) -> None:
    _, cache = model.run_with_cache(TOKENS)
    nm = nnsight.NNsight(model)
    names = [name for name in firing_order(model, TOKENS) if select(name)]
    assert names
    for name in names:
        with torch.no_grad(), nm.trace(TOKENS):
            value = envoy_at(nm, name).output.save()
        torch.testing.assert_close(value, cache[name], rtol=0, atol=1e-5, msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.parametrize("family", FAMILIES)
def test_input_of_a_hook_point_is_its_output(family):
    """A hook point is an identity: its `.input` is the activation before any edit."""
    model = model_with(family, {})
    _, cache = model.run_with_cache(TOKENS)
    nm = nnsight.NNsight(model)
    with torch.no_grad(), nm.trace(TOKENS):
        pattern_in = nm.blocks[0].attn.hook_pattern.input.save()
        scale_in = nm.blocks[1].ln2.hook_scale.input.save()
        resid_in = nm.blocks[1].hook_resid_post.input.save()
    torch.testing.assert_close(pattern_in, cache["blocks.0.attn.hook_pattern"], rtol=0, atol=1e-5)
    torch.testing.assert_close(scale_in, cache["blocks.1.ln2.hook_scale"], rtol=0, atol=1e-5)
    torch.testing.assert_close(resid_in, cache["blocks.1.hook_resid_post"], rtol=0, atol=1e-5)


def edits(model):
    """(hook name, hooked-style edit function) pairs: each is written once as a hook, once through nnsight."""
    last = model.cfg.n_layers - 1
    return [
        ("blocks.0.attn.hook_z", lambda z: z.index_fill(2, torch.tensor([1]), 0.0)),  # ablate head 1
        ("blocks.0.attn.hook_pattern", lambda p: p * 0.5),  # a pattern SDPA never materializes
        ("blocks.0.ln1.hook_normalized", lambda n: n + 0.3),  # after the fused norm kernel
        ("blocks.1.ln2.hook_scale", lambda s: s * 2.0),
        (f"blocks.{last}.hook_resid_post", lambda r: r.flip(1)),
        ("hook_embed", lambda e: e * 0.0),
    ]


@pytest.mark.parametrize("family", FAMILIES)
def test_assigned_edit_equals_run_with_hooks(family):
    model = model_with(family, {})
    nm = nnsight.NNsight(model)
    for name, edit in edits(model):
        expected = model.run_with_hooks(TOKENS, fwd_hooks=[(name, lambda x, hook, f=edit: f(x))])
        with torch.no_grad(), nm.trace(TOKENS) as tracer:
            envoy = envoy_at(nm, name)
            envoy.output = edit(envoy.output)
            out = tracer.result.save()
        assert not torch.allclose(out, model(TOKENS)), f"{name}: the edit changed nothing"
        torch.testing.assert_close(out, expected, rtol=0, atol=1e-5, msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.parametrize("family", FAMILIES)
def test_in_place_edit_equals_run_with_hooks(family):
    model = model_with(family, {})
    nm = nnsight.NNsight(model)

    def zero_head(x, hook):
        x[:, :, 2] = 0.0

    for name in ("blocks.0.attn.hook_pattern", "blocks.1.attn.hook_z"):
        expected = model.run_with_hooks(TOKENS, fwd_hooks=[(name, zero_head)])
        with torch.no_grad(), nm.trace(TOKENS) as tracer:
            envoy_at(nm, name).output[:, :, 2] = 0.0
            out = tracer.result.save()
        torch.testing.assert_close(out, expected, rtol=0, atol=1e-5)
        assert not torch.allclose(out, model(TOKENS))


@pytest.mark.parametrize("family", FAMILIES)
def test_blocks_and_components(family):
    """Blocks, attention, MLP, norms, embed and unembed as modules: outputs, inputs, edits."""
    model = model_with(family, {})
    logits, cache = model.run_with_cache(TOKENS)
    nm = nnsight.NNsight(model)
    post_norm = model.cfg.use_normalization_before_and_after  # hook_attn_out is after ln1_post there
    with torch.no_grad(), nm.trace(TOKENS):
        embed = nm.embed.output.save()
        block0 = nm.blocks[0].output.save()
        attn1 = (nm.blocks[1].ln1_post if post_norm else nm.blocks[1].attn).output.save()
        mlp1 = (nm.blocks[1].ln2_post if post_norm else nm.blocks[1].mlp).output.save()
        final_in = nm.ln_final.input.save()
        unembed = nm.unembed.output.save()
    torch.testing.assert_close(embed, cache["hook_embed"], rtol=0, atol=1e-5)
    torch.testing.assert_close(block0, cache["blocks.0.hook_resid_post"], rtol=0, atol=1e-5)
    torch.testing.assert_close(attn1, cache["blocks.1.hook_attn_out"], rtol=0, atol=1e-5)
    torch.testing.assert_close(mlp1, cache["blocks.1.hook_mlp_out"], rtol=0, atol=1e-5)
    torch.testing.assert_close(final_in, cache[f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"], rtol=0, atol=1e-5)
    torch.testing.assert_close(unembed, logits, rtol=0, atol=1e-5)

    # replacing a whole block's output is replacing its resid_post
    expected = model.run_with_hooks(TOKENS, fwd_hooks=[("blocks.0.hook_resid_post", lambda x, hook: x * 0.5)])
    with torch.no_grad(), nm.trace(TOKENS) as tracer:
        nm.blocks[0].output = nm.blocks[0].output * 0.5
        out = tracer.result.save()
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize("family", ["gpt2", "moe"])
def test_skip_a_block(family):
    """`.skip(value)` bypasses a module: skipping block 1 with its input makes it an identity."""
    model = model_with(family, {})
    expected = model.run_with_hooks(
        TOKENS,
        fwd_hooks=[("blocks.1.hook_resid_post", lambda x, hook: hook.ctx["pre"])]
        + [("blocks.1.hook_resid_pre", lambda x, hook: model.blocks[1].hook_resid_post.ctx.update(pre=x.clone()))],
    )
    nm = nnsight.NNsight(model)
    with torch.no_grad(), nm.trace(TOKENS) as tracer:
        nm.blocks[1].skip(nm.blocks[1].input)
        out = tracer.result.save()
    model.blocks[1].hook_resid_post.clear_context()
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-5)


def test_skip_a_hook_point_replaces_it():
    model = model_with("llama_gqa", {})
    expected = model.run_with_hooks(TOKENS, fwd_hooks=[("blocks.0.ln1.hook_normalized", lambda x, hook: x * 0)])
    nm = nnsight.NNsight(model)
    with torch.no_grad(), nm.trace(TOKENS) as tracer:
        normalized = nm.blocks[0].ln1.hook_normalized.input
        nm.blocks[0].ln1.hook_normalized.skip(normalized * 0)
        out = tracer.result.save()
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize("family", FAMILIES)
def test_gradients_equal_backward_hooks(family):
    """`.grad` of hook points (a norm's scale and normalized input included) equals `hooked`'s backward hooks."""
    model = model_with(family, {})
    names = [
        "blocks.0.attn.hook_pattern",
        "blocks.0.ln2.hook_scale",
        "blocks.1.ln1.hook_normalized",
        "blocks.1.hook_resid_mid",
    ]
    grads: dict[str, torch.Tensor] = {}

    def keep(g, hook):
        grads[hook.name] = g.clone()

    with model.hooks(bwd_hooks=[(n, keep) for n in names]):
        model(TOKENS)[:, -1, 3].sum().backward()
    model.zero_grad()
    nm = nnsight.NNsight(model)
    with nm.trace(TOKENS) as tracer:
        acts = [envoy_at(nm, n).output for n in names]
        loss = tracer.result[:, -1, 3].sum()
        with loss.backward():
            got = nnsight.save([])
            for a in reversed(acts):  # gradients arrive in reverse forward order
                got.append(a.grad)
    model.zero_grad()
    for name, g in zip(reversed(names), got, strict=True):
        torch.testing.assert_close(g, grads[name], rtol=0, atol=1e-5, msg=lambda m, n=name: f"{n}: {m}")


def test_unwatched_and_untraced_runs_are_unchanged():
    """A wrapped model outside a trace, and a trace that watches nothing, give the plain forward's logits exactly."""
    model = model_with("llama_gqa", {})
    logits = model(TOKENS)
    nm = nnsight.NNsight(model)
    torch.testing.assert_close(model(TOKENS), logits, rtol=0, atol=0)
    with torch.no_grad(), nm.trace(TOKENS) as tracer:
        out = tracer.result.save()
    torch.testing.assert_close(out, logits, rtol=0, atol=0)
    assert not any(hp.observed for hp in model.hook_points())


@pytest.mark.parametrize("family", FAMILIES)
def test_tracer_cache_of_every_hook_point_equals_run_with_cache(family):
    """nnsight's own `tracer.cache()` over the hook points: a cache observer counts as watching."""
    model = model_with(family, FLAG_SETS["split_inputs"])
    _, cache = model.run_with_cache(TOKENS)
    names = [n for n, hp in model.hook_dict.items() if model.is_active(hp)]
    nm = nnsight.NNsight(model)
    with torch.no_grad(), nm.trace(TOKENS) as tracer:
        recorded = tracer.cache(modules=[f"model.{n}" for n in names])
    for name in names:
        torch.testing.assert_close(
            recorded[f"model.{name}"].output, cache[name], rtol=0, atol=1e-5, msg=lambda m, n=name: f"{n}: {m}"
        )


def test_hooked_nnsight_inputs():
    """HookedNNsight: text as `to_tokens` gives it, one float input passed through, a clear error for batched floats."""
    from hooked.compat.nnsight import HookedNNsight
    from hooked.core.errors import InputTypeError
    from tests.tiny_models import hooked_from, make_tokenizer, tiny_gpt2

    model = hooked_from(tiny_gpt2(), tokenizer=make_tokenizer())
    nm = HookedNNsight(model)
    text = "The quick brown fox"
    with torch.no_grad(), nm.trace(text) as tracer:
        embed = nm.hook_embed.output.save()
        logits = tracer.result.save()
    torch.testing.assert_close(logits, model(text), rtol=0, atol=1e-5)
    with torch.no_grad(), nm.trace(embed, return_type="logits") as tracer:  # token embeddings in: same logits
        from_embeds = tracer.result.save()
    torch.testing.assert_close(from_embeds, model(embed), rtol=0, atol=1e-5)
    with pytest.raises(InputTypeError, match="text and token ids"), torch.no_grad(), nm.trace() as tracer:
        with tracer.invoke(embed):
            pass
        with tracer.invoke(text):
            pass


def test_hooked_nnsight_generate_matches_model_generate():
    """`nm.generate` is `model.generate` (greedy by default; sampling with a seed when asked)."""
    from hooked.compat.nnsight import HookedNNsight
    from tests.tiny_models import hooked_from, make_tokenizer, tiny_gpt2

    model = hooked_from(tiny_gpt2(), tokenizer=make_tokenizer())
    nm = HookedNNsight(model)
    prompt = "When Mary and John went"
    for options in (dict(), dict(do_sample=True, seed=3, temperature=2.0)):
        with torch.no_grad(), nm.generate(prompt, max_new_tokens=4, **options) as tracer:
            ids = tracer.result.save()
        settings = {"do_sample": False, "verbose": False, **options}
        expected = model.generate(model.to_tokens(prompt), max_new_tokens=4, **settings)
        assert ids.tolist() == expected.tolist(), options
