"""Components called on their own with TransformerLens's signatures equal the model's own forward."""

from __future__ import annotations

import pytest
import torch

from hooked import HookedTransformer, HookedTransformerConfig

VARIANTS = {
    "gpt2-like": dict(positional_embedding_type="standard", act_fn="gelu_new"),
    "rotary-gqa": dict(
        positional_embedding_type="rotary", normalization_type="RMS", n_key_value_heads=2, gated_mlp=True, act_fn="silu"
    ),
}


def tiny_model(**overrides) -> HookedTransformer:
    cfg = dict(n_layers=2, d_model=32, d_head=8, n_heads=4, n_ctx=32, d_vocab=50, act_fn="gelu", seed=0, device="cpu")
    cfg.update(overrides)
    model = HookedTransformer(HookedTransformerConfig(**cfg))
    with torch.no_grad():  # non-trivial norm parameters and biases
        for name, p in model.named_parameters():
            if not name.split(".")[-1].startswith(("W_", "_W_")):
                p.add_(torch.randn_like(p) * 0.1)
    return model


@pytest.fixture(params=list(VARIANTS))
def model(request) -> HookedTransformer:
    return tiny_model(**VARIANTS[request.param])


def _cache(model, tokens, **kwargs):
    _, cache = model.run_with_cache(tokens, **kwargs)
    return cache


def test_block_and_sublayers_alone_match_the_forward(model):
    tokens = torch.randint(0, 50, (2, 7))
    cache = _cache(model, tokens)
    for layer, block in enumerate(model.blocks):
        resid_pre = cache["resid_pre", layer]
        torch.testing.assert_close(block(resid_pre), cache["resid_post", layer], atol=1e-5, rtol=1e-5)
        normed = block.ln1(resid_pre)
        torch.testing.assert_close(block.attn(normed, normed, normed), cache["attn_out", layer], atol=1e-5, rtol=1e-5)
        mlp_out = block.mlp(block.ln2(cache["resid_mid", layer]))
        torch.testing.assert_close(mlp_out, cache["mlp_out", layer], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(model.embed(tokens), cache["hook_embed"])
    final = model.unembed(model.ln_final(cache["resid_post", model.cfg.n_layers - 1]))
    torch.testing.assert_close(final, model(tokens), atol=1e-5, rtol=1e-5)


def test_block_alone_with_a_left_padding_mask_matches_the_forward(model):
    tokens = torch.randint(1, 50, (2, 6))
    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    cache = _cache(model, tokens, attention_mask=mask)
    out = model.blocks[0](cache["resid_pre", 0], attention_mask=mask)
    real = mask.bool()
    torch.testing.assert_close(out[real], cache["resid_post", 0][real], atol=1e-5, rtol=1e-5)


def test_block_alone_is_causal(model):
    x = torch.randn(1, 6, 32)
    edited = x.clone()
    edited[:, 4:] += 1.0
    torch.testing.assert_close(model.blocks[0](x)[:, :4], model.blocks[0](edited)[:, :4])


def test_pos_embed_of_tokens_gives_position_embeddings_for_the_batch():
    model = tiny_model()
    tokens = torch.randint(0, 50, (3, 5))
    pos = model.pos_embed(tokens)
    assert pos.shape == (3, 5, 32)
    torch.testing.assert_close(pos, model.W_pos[:5].expand(3, 5, 32))
    torch.testing.assert_close(model.pos_embed(tokens[:, :2], past_kv_pos_offset=3), model.W_pos[3:5].expand(3, 2, 32))
    torch.testing.assert_close(pos, _cache(model, tokens)["hook_pos_embed"])


def test_pos_embed_with_a_left_padding_mask_matches_the_forward():
    model = tiny_model()
    tokens = torch.randint(1, 50, (2, 5))
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    pos = model.pos_embed(tokens, attention_mask=mask)
    torch.testing.assert_close(pos, _cache(model, tokens, attention_mask=mask)["hook_pos_embed"])
    torch.testing.assert_close(pos[0, 2:], model.W_pos[:3])
    assert pos[0, :2].abs().max() == 0
