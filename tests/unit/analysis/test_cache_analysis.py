"""ActivationCache decompositions: every stack sums back to the residual stream it decomposes."""

import pytest
import torch

from hooked import HookedTransformer, HookedTransformerConfig
from hooked.core.utils import Slice, gather_pos, token_index

torch.set_num_threads(1)

ATOL = 1e-5  # docs/numerics.md#tolerances: decompositions on tiny models
VARIANTS = {
    "ln_gelu": dict(normalization_type="LN", act_fn="gelu"),
    "rms_gated": dict(normalization_type="RMS", act_fn="silu", gated_mlp=True),
    "nonorm_relu": dict(normalization_type=None, act_fn="relu"),
    "rms_gqa_rotary": dict(
        normalization_type="RMS", act_fn="silu", gated_mlp=True, n_key_value_heads=2, positional_embedding_type="rotary"
    ),
    "ln_attn_only": dict(normalization_type="LN", attn_only=True),
}


def make_model(unit_gains: bool = False, **overrides) -> HookedTransformer:
    """A tiny random model whose biases (and, unless `unit_gains`, norm parameters) are non-zero."""
    kwargs = dict(d_model=32, d_head=8, n_layers=2, n_ctx=16, d_vocab=50, d_mlp=40, seed=0)
    kwargs.update(overrides)
    model = HookedTransformer(HookedTransformerConfig(**kwargs))
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            is_norm = ".ln" in name or name.startswith("ln_final")
            if is_norm and unit_gains:
                continue
            leaf = name.rsplit(".", 1)[-1]
            if leaf == "w" or leaf.startswith(("b", "_b")):
                p.add_(torch.randn(p.shape, generator=gen) * 0.2)
    return model


def run(model, batch: int = 2, pos: int = 6):
    tokens = torch.randint(0, model.cfg.d_vocab, (batch, pos), generator=torch.Generator().manual_seed(2))
    logits, cache = model.run_with_cache(tokens)
    return tokens, logits, cache


@pytest.fixture(scope="module", params=list(VARIANTS))
def setup(request):
    model = make_model(**VARIANTS[request.param])
    return (model, *run(model))


@pytest.fixture(scope="module", params=[k for k, v in VARIANTS.items() if not v.get("attn_only")])
def setup_with_mlp(request):
    model = make_model(**VARIANTS[request.param])
    return (model, *run(model))


@pytest.fixture(
    scope="module", params=[k for k, v in VARIANTS.items() if v.get("normalization_type", "LN") is not None]
)
def setup_with_norm(request):
    model = make_model(**VARIANTS[request.param])
    return (model, *run(model))


def resid_entering(cache, model, layer: int, mlp_input: bool = False):
    if mlp_input:
        return cache["resid_mid", layer]
    return cache["resid_post", model.cfg.n_layers - 1] if layer == model.cfg.n_layers else cache["resid_pre", layer]


def close(a, b, atol=ATOL):
    torch.testing.assert_close(a, b, atol=atol, rtol=0)


def test_decompose_resid_sums_to_residual(setup):
    model, _, _, cache = setup
    L = model.cfg.n_layers
    for layer in range(L + 1):
        for mlp_input in (False, True) if layer < L and not model.cfg.attn_only else (False,):
            stack, labels = cache.decompose_resid(layer, mlp_input=mlp_input, return_labels=True)
            assert stack.shape[0] == len(labels)
            close(stack.sum(0), resid_entering(cache, model, layer, mlp_input))
    _, labels = cache.decompose_resid(return_labels=True)
    expected = ["embed"] + (["pos_embed"] if model.cfg.positional_embedding_type == "standard" else [])
    for layer_i in range(L):
        expected += [f"{layer_i}_attn_out"] + ([] if model.cfg.attn_only else [f"{layer_i}_mlp_out"])
    assert labels == expected


def test_accumulated_resid_labels_and_ln(setup):
    model, _, logits, cache = setup
    L = model.cfg.n_layers
    stack, labels = cache.accumulated_resid(incl_mid=not model.cfg.attn_only, return_labels=True)
    mids = [] if model.cfg.attn_only else ["0_mid", "1_mid"]
    assert labels == ["0_pre", *mids[:1], "1_pre", *mids[1:], "final_post"]
    close(stack[-1], cache["resid_post", L - 1], atol=0)
    _, labels = cache.accumulated_resid(layer=1, mlp_input=not model.cfg.attn_only, return_labels=True)
    assert labels == ["0_pre", "1_pre"] + ([] if model.cfg.attn_only else ["1_mid"])
    assert cache.accumulated_resid(pos_slice=-1).shape == (L + 1, 2, model.cfg.d_model)  # an int drops pos
    if model.cfg.normalization_type is not None:
        # Cached-scale LN of a layer's own input is exactly what that layer's ln1 normalized.
        for layer_i in range(L):
            normed = cache.apply_ln_to_stack(cache["resid_pre", layer_i][None], layer_i)[0]
            close(normed, cache["normalized", layer_i, "ln1"])
        # At the final layer apply_ln recomputes ln_final per component.
        final = cache.accumulated_resid(apply_ln=True)
        close(final[0], model.ln_final(cache["resid_pre", 0]))


def test_head_results_and_remainder(setup):
    model, _, _, cache = setup
    L, H = model.cfg.n_layers, model.cfg.n_heads
    stack, labels = cache.stack_head_results(layer=-1, incl_remainder=True, return_labels=True)
    assert labels == [f"L{layer_i}H{h}" for layer_i in range(L) for h in range(H)] + ["remainder"]
    assert stack.shape == (L * H + 1, 2, 6, model.cfg.d_model)
    close(stack.sum(0), cache["resid_post", L - 1])
    for layer_i in range(L):
        close(cache["result", layer_i].sum(-2) + model.blocks[layer_i].attn.b_O, cache["attn_out", layer_i])
    empty = cache.stack_head_results(layer=0)
    assert empty.shape == (0, 2, 6, model.cfg.d_model)
    one = cache.stack_head_results(layer=1, pos_slice=-1, incl_remainder=True)
    assert one.shape == (H + 1, 2, model.cfg.d_model)
    close(one.sum(0), cache["resid_pre", 1][:, -1])


def test_stack_activation(setup):
    model, _, _, cache = setup
    stacked = cache.stack_activation("pattern")
    assert stacked.shape == (model.cfg.n_layers, 2, model.cfg.n_heads, 6, 6)
    close(stacked[1], cache["pattern", 1], atol=0)


@pytest.mark.parametrize("expand_neurons", [True, False])
def test_full_resid_decomposition_sums_to_residual(setup, expand_neurons):
    model, _, _, cache = setup
    L = model.cfg.n_layers
    for layer in range(L + 1):
        for mlp_input in (False, True) if layer < L and not model.cfg.attn_only else (False,):
            stack, labels = cache.get_full_resid_decomposition(
                layer, mlp_input=mlp_input, expand_neurons=expand_neurons, return_labels=True
            )
            assert stack.shape[0] == len(labels) and labels[-1] == "bias"
            close(stack.sum(0), resid_entering(cache, model, layer, mlp_input))
    _, labels = cache.get_full_resid_decomposition(expand_neurons=expand_neurons, return_labels=True)
    if not model.cfg.attn_only:
        mlp_label = "L1N39" if expand_neurons else "1_mlp_out"
        assert mlp_label in labels and labels.index(mlp_label) > labels.index("L1H3")


@pytest.mark.parametrize("variant", ["ln_gelu", "rms_gated", "nonorm_relu", "rms_gqa_rotary"])
def test_logit_attrs_sum_to_logit_difference(variant):
    """With unit norm gains (as after fold_ln), DLA of the full decomposition is the logit difference minus b_U."""
    model = make_model(unit_gains=True, **VARIANTS[variant])
    tokens, logits, cache = run(model)
    correct, wrong = torch.tensor([3, 7]), torch.tensor([11, 5])
    b_U = model.b_U
    stack = cache.get_full_resid_decomposition(pos_slice=-1)  # [component, batch, d_model]
    attrs = cache.logit_attrs(stack, correct, wrong, pos_slice=-1)
    assert attrs.shape == (stack.shape[0], 2)
    rows = torch.arange(2)
    diff = logits[rows, -1, correct] - logits[rows, -1, wrong]
    close(attrs.sum(0) + b_U[correct] - b_U[wrong], diff, atol=1e-4)
    # Per-position targets: [batch, pos] tokens against a full-position stack.
    stack = cache.decompose_resid()
    targets = tokens.roll(-1, dims=1)
    attrs = cache.logit_attrs(stack, targets)
    assert attrs.shape == (stack.shape[0], 2, 6)
    expected = logits.gather(-1, targets[..., None])[..., 0] - b_U[targets]
    close(attrs.sum(0), expected, atol=1e-4)
    # A batch slice picks the matching row of the cached scale.
    for batch_slice in ([1], 1):  # the stack and the cached scale are both sliced; an int drops the batch axis
        attrs1 = cache.logit_attrs(stack[:, :, -1], correct[1], wrong[1], pos_slice=-1, batch_slice=batch_slice)
        expected = diff[1] - b_U[correct[1]] + b_U[wrong[1]]
        close(attrs1.sum(0), expected.reshape(attrs1.shape[1:]), atol=1e-4)
    with pytest.raises(ValueError, match="same shape"):
        cache.logit_attrs(stack, correct, torch.tensor(1))


def test_logit_lens_last_component_is_logits(setup):
    model, _, logits, cache = setup
    lens, labels = cache.logit_lens(return_labels=True)
    assert lens.shape == (model.cfg.n_layers + 1, 2, 6, model.cfg.d_vocab) and labels[-1] == "final_post"
    close(lens[-1], logits)
    last = cache.logit_lens(pos_slice=-1, incl_mid=not model.cfg.attn_only)
    close(last[-1], logits[:, -1])


def test_logit_lens_soft_cap():
    model = make_model(output_logits_soft_cap=2.0, **VARIANTS["rms_gated"])
    _, logits, cache = run(model)
    close(cache.logit_lens()[-1], logits)


@pytest.mark.parametrize("apply_ln", [False, True])
def test_neuron_results_and_projection(setup_with_mlp, apply_ln):
    model, _, _, cache = setup_with_mlp
    d, d_mlp = model.cfg.d_model, model.cfg.d_mlp
    per_neuron = cache.get_neuron_results(1)
    assert per_neuron.shape == (2, 6, d_mlp, d)
    close(per_neuron.sum(-2) + model.blocks[1].mlp.b_out, cache["mlp_out", 1])
    stack, labels = cache.stack_neuron_results(2, return_labels=True, incl_remainder=True, apply_ln=apply_ln)
    assert labels[:2] == ["L0N0", "L0N1"] and labels[-1] == "remainder" and len(labels) == 2 * d_mlp + 1
    proj = torch.randn(d, 3, generator=torch.Generator().manual_seed(3))
    projected = cache.stack_neuron_results(2, incl_remainder=True, apply_ln=apply_ln, project_output_onto=proj)
    close(projected, stack @ proj)
    projected_1d = cache.stack_neuron_results(2, apply_ln=apply_ln, project_output_onto=proj[:, 0])
    close(projected_1d, stack[:-1] @ proj[:, 0])
    full = cache.get_full_resid_decomposition(apply_ln=apply_ln, pos_slice=-1)
    full_proj = cache.get_full_resid_decomposition(apply_ln=apply_ln, pos_slice=-1, project_output_onto=proj)
    close(full_proj, full @ proj)
    sliced, labels = cache.stack_neuron_results(1, neuron_slice=5, pos_slice=-1, return_labels=True)
    assert labels == ["L0N5"] and sliced.shape == (1, 2, d)
    close(sliced[0], cache.get_neuron_results(0, neuron_slice=5, pos_slice=-1))
    close(cache.get_neuron_results(0, project_output_onto=proj[:, 0]), cache.get_neuron_results(0) @ proj[:, 0])


def test_compute_head_results_warns_when_present(caplog):
    model = make_model(**VARIANTS["ln_gelu"])
    model.set_use_attn_result(True)
    try:
        _, _, cache = run(model)
    finally:
        model.set_use_attn_result(False)
    cached = cache["result", 0]
    with caplog.at_level("WARNING"):
        cache.compute_head_results()
    assert "already" in caplog.text and cache["result", 0] is cached
    _, _, plain = run(model)
    plain.compute_head_results()
    close(plain["result", 0], cached)


def test_apply_slice_to_batch_dim_and_remove_batch_dim(setup):
    model, _, logits, cache = setup
    one = cache.apply_slice_to_batch_dim(1)
    assert not one.has_batch_dim and one["resid_pre", 0].shape == (6, model.cfg.d_model)
    close(one["resid_pre", 1], cache["resid_pre", 1][1], atol=0)
    assert one.tokens.shape == (6,)
    kept = cache.apply_slice_to_batch_dim([1])
    assert kept.has_batch_dim and kept["pattern", 0].shape[0] == 1
    lens = kept.logit_lens()
    close(lens[-1], logits[1:])
    stack = one.decompose_resid(pos_slice=-1)
    close(stack.sum(0), cache["resid_post", 1][1, -1])


def test_slice_semantics():
    x = torch.arange(24).reshape(2, 3, 4)
    assert Slice(1).apply(x, dim=1).shape == (2, 4)
    assert Slice((0, 2)).apply(x, dim=1).shape == (2, 2, 4)
    assert Slice([0, 2]).apply(x, dim=-1).shape == (2, 3, 2)
    assert Slice(None).apply(x, dim=1) is not None and Slice().mode == "empty"
    assert Slice(slice(1, None)).indices(3).tolist() == [1, 2]


def test_token_index_and_gather_pos():
    left = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    right = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    assert token_index(-1, left).tolist() == [4, 4]
    assert token_index(0, left).tolist() == [2, 0]
    assert token_index(-1, right).tolist() == [2, 4]
    assert token_index(torch.tensor([1, -2]), right).tolist() == [1, 3]
    with pytest.raises(IndexError):
        token_index(3, left)
    x = torch.arange(2 * 5 * 3).reshape(2, 5, 3)
    assert torch.equal(gather_pos(x, torch.tensor([4, 1])), torch.stack([x[0, 4], x[1, 1]]))
    pattern = torch.randn(2, 4, 5, 5)
    picked = gather_pos(pattern, torch.tensor([2, 3]), axis=2)
    assert torch.equal(picked, torch.stack([pattern[0, :, 2], pattern[1, :, 3]]))
    assert gather_pos(x, torch.tensor([[0, 1], [2, 3]])).shape == (2, 2, 3)


def test_cache_token_index_under_left_padding():
    model = make_model(**VARIANTS["rms_gqa_rotary"])
    tokens = torch.randint(1, 50, (2, 5), generator=torch.Generator().manual_seed(4))
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    _, cache = model.run_with_cache(tokens, attention_mask=mask)
    assert cache.token_index(0).tolist() == [2, 0] and cache.token_index(-1).tolist() == [4, 4]
    _, plain = model.run_with_cache(tokens)
    assert plain.token_index(-2).tolist() == [3, 3]


def test_apply_ln_of_full_decomposition_is_the_normalized_stream(setup_with_norm):
    """Cached-scale LN is linear, so the normalized components sum to the norm's `hook_normalized`."""
    model, _, _, cache = setup_with_norm
    L = model.cfg.n_layers
    readers = [(1, False, "blocks.1.ln1.hook_normalized"), (None, False, "ln_final.hook_normalized")]
    if not model.cfg.attn_only:
        readers.append((0, True, "blocks.0.ln2.hook_normalized"))
    for layer, mlp_input, key in readers:
        for expand_neurons in (True, False):
            stack = cache.get_full_resid_decomposition(
                layer, mlp_input=mlp_input, expand_neurons=expand_neurons, apply_ln=True, pos_slice=[1, 4]
            )
            close(stack.sum(0), cache[key][:, [1, 4]])
    accumulated = cache.accumulated_resid(layer=1, apply_ln=True)
    close(accumulated[-1], cache["normalized", 1, "ln1"])
    assert L == 2


def test_split_qkv_mode_uses_query_head_zero_scale():
    model = make_model(**VARIANTS["ln_gelu"])
    model.set_use_split_qkv_input(True)
    try:
        _, _, cache = run(model)
    finally:
        model.set_use_split_qkv_input(False)
    normed = cache.apply_ln_to_stack(cache["resid_pre", 1][None, :, -1], 1, pos_slice=-1)[0]
    close(normed, cache["normalized", 1, "ln1"][:, -1, 0])
    close(cache.decompose_resid(layer=1, apply_ln=True).sum(0), cache["normalized", 1, "ln1"][:, :, 0])


def test_mlp_input_on_an_attention_only_model():
    """No MLP reads the stream of an attention-only block: without norms the stack comes back unchanged (as in
    TransformerLens); with norms there is no ln2 scale, and the error says to drop mlp_input."""
    from hooked.core.errors import InputError

    _, cache = make_model(normalization_type=None, attn_only=True).run_with_cache(torch.arange(6)[None])
    stack = cache.decompose_resid(layer=1, mlp_input=True)
    assert torch.equal(cache.apply_ln_to_stack(stack, layer=1, mlp_input=True), stack)
    assert torch.equal(cache.decompose_resid(layer=1, mlp_input=True, apply_ln=True), stack)
    _, cache = make_model(normalization_type="LN", attn_only=True).run_with_cache(torch.arange(6)[None])
    with pytest.raises(InputError, match="attention-only model has no MLP"):
        cache.decompose_resid(layer=1, mlp_input=True, apply_ln=True)
