"""Weight views (docs/analysis-and-patching.md#weights-circuits-and-composition): stacked weights,
factored circuits, composition scores, residual directions."""

from __future__ import annotations

import pytest
import torch

from hooked import FactoredMatrix, HookedTransformer, HookedTransformerConfig
from hooked.models.weight_views_mixin import composition_scores

torch.set_num_threads(1)

L, H, D, DH, DM, V, CTX = 2, 4, 32, 8, 48, 50, 16


def make(bias: bool = True, **overrides) -> HookedTransformer:
    cfg = dict(
        d_model=D,
        d_head=DH,
        n_heads=H,
        n_layers=L,
        n_ctx=CTX,
        d_mlp=DM,
        d_vocab=V,
        act_fn="gelu_new",
        seed=0,
        device="cpu",
    )
    cfg.update(overrides)
    model = HookedTransformer(HookedTransformerConfig(**cfg))
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if bias and not name.rsplit(".", 1)[-1].startswith(("W_", "_W_", "w")):
                p.copy_(torch.randn(p.shape, generator=gen))
    return model


MODELS = {
    "mha": dict(),
    "gqa2_gated": dict(n_key_value_heads=2, gated_mlp=True, act_fn="silu"),
    "mqa_rotary": dict(n_key_value_heads=1, positional_embedding_type="rotary"),
    "attn_only": dict(attn_only=True, act_fn=None),
}


@pytest.mark.parametrize("name", list(MODELS))
def test_view_shapes(name):
    model = make(**MODELS[name])
    cfg = model.cfg
    shapes = dict(
        W_E=(V, D),
        W_U=(D, V),
        b_U=(V,),
        W_Q=(L, H, D, DH),
        W_K=(L, H, D, DH),
        W_V=(L, H, D, DH),
        W_O=(L, H, DH, D),
        b_Q=(L, H, DH),
        b_K=(L, H, DH),
        b_V=(L, H, DH),
        b_O=(L, D),
    )
    if not cfg.attn_only:
        shapes.update(W_in=(L, D, DM), W_out=(L, DM, D), b_in=(L, DM), b_out=(L, D))
    if cfg.gated_mlp:
        shapes.update(W_gate=(L, D, DM))
    if cfg.positional_embedding_type == "standard":
        shapes.update(W_pos=(CTX, D), W_E_pos=(V + CTX, D))
    else:
        with pytest.raises(AttributeError, match="W_pos"):
            _ = model.W_pos
    for attr, shape in shapes.items():
        assert tuple(getattr(model, attr).shape) == shape, attr
    if not cfg.gated_mlp:
        assert model.W_gate is None
    assert model.QK.shape == (L, H, D, D) and model.OV.shape == (L, H, D, D)
    assert model.blocks[1].attn.QK.shape == (H, D, D) and model.blocks[1].attn.OV.shape == (H, D, D)
    assert model.all_head_labels()[: H + 1] == [f"L0H{h}" for h in range(H)] + ["L1H0"]


@pytest.mark.parametrize("name", ["gqa2_gated", "mqa_rotary"])
def test_gqa_key_value_views_repeat_each_group(name):
    model = make(**MODELS[name])
    repeats = H // model.cfg.n_key_value_heads
    for layer, block in enumerate(model.blocks):
        for h in range(H):
            assert torch.equal(model.W_K[layer, h], block.attn._W_K[h // repeats])
            assert torch.equal(model.W_V[layer, h], block.attn._W_V[h // repeats])
            assert torch.equal(model.b_V[layer, h], block.attn._b_V[h // repeats])


@pytest.mark.parametrize("name", list(MODELS))
def test_qk_and_ov_are_the_per_head_products(name):
    model = make(**MODELS[name])
    with torch.no_grad():
        QK, OV = model.QK.AB, model.OV.AB
        torch.testing.assert_close(QK, model.W_Q @ model.W_K.transpose(-1, -2), atol=1e-6, rtol=0)
        torch.testing.assert_close(OV, model.W_V @ model.W_O, atol=1e-6, rtol=0)
        for layer, block in enumerate(model.blocks):
            torch.testing.assert_close(block.attn.QK.AB, QK[layer], atol=1e-6, rtol=0)
            torch.testing.assert_close(block.attn.OV.AB, OV[layer], atol=1e-6, rtol=0)


@pytest.mark.parametrize("name", ["mha", "attn_only"])
def test_accumulated_bias_is_the_sum_of_earlier_output_biases(name):
    model = make(**MODELS[name])
    b_O = [b.attn.b_O for b in model.blocks]
    b_out = [torch.zeros(D) if model.cfg.attn_only else b.mlp.b_out for b in model.blocks]
    with torch.no_grad():
        for layer in range(L + 1):
            manual = sum((b_O[i] + b_out[i] for i in range(layer)), torch.zeros(D))
            torch.testing.assert_close(model.accumulated_bias(layer), manual, atol=1e-6, rtol=0)
            attn_only = sum((b_O[i] for i in range(layer)), torch.zeros(D))
            torch.testing.assert_close(
                model.accumulated_bias(layer, include_mlp_biases=False), attn_only, atol=1e-6, rtol=0
            )
            if layer < L:
                torch.testing.assert_close(
                    model.accumulated_bias(layer, mlp_input=True), manual + b_O[layer], atol=1e-6, rtol=0
                )


def brute_force_composition(model: HookedTransformer, mode: str) -> torch.Tensor:
    """Materialise every `[d, d]` circuit in float64 and take Frobenius norms directly."""
    W_Q, W_K, W_V, W_O = (t.detach().double() for t in (model.W_Q, model.W_K, model.W_V, model.W_O))
    OV, QK = W_V @ W_O, W_Q @ W_K.transpose(-1, -2)  # [L, H, d, d]
    right = {"Q": QK, "K": QK.transpose(-1, -2), "V": OV}[mode]
    out = torch.zeros(L, H, L, H, dtype=torch.float64)
    for l1 in range(L):
        for h1 in range(H):
            for l2 in range(l1 + 1, L):
                for h2 in range(H):
                    prod = OV[l1, h1] @ right[l2, h2]
                    out[l1, h1, l2, h2] = prod.norm() / (OV[l1, h1].norm() * right[l2, h2].norm())
    return out


@pytest.mark.parametrize("name", ["mha", "gqa2_gated", "mqa_rotary"])
@pytest.mark.parametrize("mode", ["Q", "K", "V"])
def test_all_composition_scores_match_brute_force(name, mode):
    model = make(**MODELS[name])
    with torch.no_grad():
        scores = model.all_composition_scores(mode)
    assert scores.shape == (L, H, L, H)
    torch.testing.assert_close(scores.double(), brute_force_composition(model, mode), atol=1e-5, rtol=0)
    assert torch.count_nonzero(scores[1, :, 0]) == 0 and torch.count_nonzero(scores[0, :, 0]) == 0


def test_composition_scores_modes_differ_and_bad_mode_raises():
    model = make(n_layers=3)
    with torch.no_grad():
        q, k = model.all_composition_scores("Q"), model.all_composition_scores("K")
    assert not torch.allclose(q, k)
    with pytest.raises(ValueError, match="mode"):
        model.all_composition_scores("O")


def test_composition_scores_function_broadcasts_left_then_right():
    gen = torch.Generator().manual_seed(0)
    left = FactoredMatrix(torch.randn(3, 6, 2, generator=gen), torch.randn(3, 2, 6, generator=gen))
    right = FactoredMatrix(torch.randn(5, 6, 2, generator=gen), torch.randn(5, 2, 6, generator=gen))
    scores = composition_scores(left, right)
    assert scores.shape == (3, 5)
    expected = torch.linalg.matrix_norm(left.AB[1] @ right.AB[4]) / left.AB[1].norm() / right.AB[4].norm()
    torch.testing.assert_close(scores[1, 4], expected, atol=1e-6, rtol=0)


def test_tokens_to_residual_directions_shapes(tokenizer):
    model = HookedTransformer(
        HookedTransformerConfig(d_model=D, d_head=DH, n_layers=1, n_ctx=CTX, act_fn="gelu_new", seed=0, device="cpu"),
        tokenizer=tokenizer,
    )
    W_U = model.W_U
    assert model.tokens_to_residual_directions(5).shape == (D,)
    assert torch.equal(model.tokens_to_residual_directions(5), W_U[:, 5])
    assert model.tokens_to_residual_directions(torch.tensor([1, 2, 3])).shape == (3, D)
    batch = torch.tensor([[1, 2, 3], [4, 5, 6]])
    directions = model.tokens_to_residual_directions(batch)
    assert directions.shape == (2, 3, D) and torch.equal(directions[1, 2], W_U[:, 6])
    token = model.to_single_token(" the") if len(tokenizer.encode(" the")) == 1 else model.to_single_token("T")
    assert torch.equal(model.tokens_to_residual_directions(model.to_single_str_token(token)), W_U[:, token])


def test_accumulated_bias_of_moe_models():
    """Bias-free experts add nothing; GPT-OSS's per-expert output biases are mixed per token, so there
    is no constant."""
    from tests.tiny_models import tiny_hooked

    model = tiny_hooked("moe")
    with torch.no_grad():
        for block in model.blocks:
            block.attn.b_O.normal_()
    want = model.blocks[0].attn.b_O + model.blocks[1].attn.b_O
    torch.testing.assert_close(model.accumulated_bias(1, mlp_input=True), want, atol=0, rtol=0)
    gpt_oss = tiny_hooked("moe", swiglu_limit=7.0, norm_topk_prob=True)
    with pytest.raises(NotImplementedError, match="include_mlp_biases=False"):
        gpt_oss.accumulated_bias(1)
    torch.testing.assert_close(gpt_oss.accumulated_bias(1, include_mlp_biases=False), gpt_oss.blocks[0].attn.b_O)
