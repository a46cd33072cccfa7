"""`components/bert.py` on its own: embeddings, the post-LN block, heads, hook names and shapes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hooked.components.bert import BertBlock, BertEmbed, BertMLMHead, BertNSPHead, BertPooler, mask_from_additive
from hooked.core.config import HookedTransformerConfig


def config(**overrides) -> HookedTransformerConfig:
    fields = dict(
        d_model=16,
        d_head=4,
        n_heads=4,
        n_layers=1,
        n_ctx=12,
        d_vocab=30,
        d_mlp=32,
        act_fn="gelu",
        attention_dir="bidirectional",
    )
    fields.update(overrides)
    return HookedTransformerConfig(**fields)


def randomize(module: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    return module


def test_embed_is_the_layer_norm_of_three_summed_embeddings():
    cfg = config()
    embed = randomize(BertEmbed(cfg))
    tokens = torch.tensor([[3, 7, 1, 9]])
    types = torch.tensor([[0, 0, 1, 1]])
    total = embed.embed.W_E[tokens] + embed.pos_embed.W_pos[:4] + embed.token_type_embed.W_token_type[types]
    expected = F.layer_norm(total, (16,), embed.ln.w, embed.ln.b, eps=cfg.eps)
    torch.testing.assert_close(embed(tokens, types), expected, atol=1e-6, rtol=0)
    no_types = F.layer_norm(
        total - embed.token_type_embed.W_token_type[types] + embed.token_type_embed.W_token_type[0],
        (16,),
        embed.ln.w,
        embed.ln.b,
        eps=cfg.eps,
    )
    torch.testing.assert_close(embed(tokens), no_types, atol=1e-6, rtol=0)  # token types default to 0


def test_block_normalizes_after_each_residual_add():
    cfg = config()
    block = randomize(BertBlock(cfg))
    x = torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        mid = x + block.attn(x, x, x)
        normed_mid = block.ln1(mid)
        expected = block.ln2(normed_mid + block.mlp(normed_mid))
        torch.testing.assert_close(block(x), expected, atol=1e-6, rtol=0)


def test_block_takes_transformer_lens_additive_mask():
    cfg = config()
    block = randomize(BertBlock(cfg), seed=2)
    x = torch.randn(1, 6, 16, generator=torch.Generator().manual_seed(3))
    additive = torch.zeros(1, 1, 1, 6)
    additive[..., 4:] = float("-inf")
    assert mask_from_additive(additive).tolist() == [[1, 1, 1, 1, 0, 0]]
    with torch.no_grad():
        masked = block(x, additive)
        changed = x.clone()
        changed[:, 4:] += 5.0  # masked keys: the first 4 positions must not see the change
        torch.testing.assert_close(block(changed, additive)[:, :4], masked[:, :4], atol=1e-6, rtol=0)
        assert (block(changed)[:, :4] - masked[:, :4]).abs().max() > 1e-3  # unmasked, they would


def test_bidirectional_block_lets_early_positions_see_later_ones():
    block = randomize(BertBlock(config()), seed=4)
    x = torch.randn(1, 5, 16, generator=torch.Generator().manual_seed(5))
    changed = x.clone()
    changed[:, -1] += 3.0
    with torch.no_grad():
        assert (block(changed)[:, 0] - block(x)[:, 0]).abs().max() > 1e-3


def test_block_hooks_have_transformer_lens_names_and_shapes():
    from hooked.core.hook_points import HookedRootModule

    class Root(HookedRootModule):
        def __init__(self):
            super().__init__()
            self.cfg = config(use_split_qkv_input=True, use_hook_mlp_in=True)
            self.block = randomize(BertBlock(self.cfg))
            self.setup()

        def forward(self, x):
            return self.block(x)

    root = Root()
    _, cache = root.run_with_cache(torch.randn(2, 5, 16))
    shapes = {name: tuple(t.shape) for name, t in cache.items()}
    for name in (
        "hook_resid_pre",
        "hook_attn_out",
        "hook_resid_mid",
        "hook_mlp_in",
        "hook_mlp_out",
        "hook_resid_post",
        "hook_normalized_resid_post",
    ):
        assert shapes[f"block.{name}"] == (2, 5, 16), name
    for name in ("hook_q_input", "hook_k_input", "hook_v_input"):
        assert shapes[f"block.{name}"] == (2, 5, 4, 16), name
    assert shapes["block.attn.hook_pattern"] == (2, 4, 5, 5)


def test_heads():
    cfg = config()
    mlm, pooler, nsp = randomize(BertMLMHead(cfg)), randomize(BertPooler(cfg), 1), randomize(BertNSPHead(cfg), 2)
    x = torch.randn(3, 4, 16, generator=torch.Generator().manual_seed(6))
    expected_mlm = F.layer_norm(F.gelu(x @ mlm.W + mlm.b), (16,), mlm.ln.w, mlm.ln.b, eps=cfg.eps)
    torch.testing.assert_close(mlm(x), expected_mlm, atol=1e-6, rtol=0)
    pooled = pooler(x)
    torch.testing.assert_close(pooled, torch.tanh(x[:, 0] @ pooler.W + pooler.b), atol=1e-6, rtol=0)
    assert nsp(pooled).shape == (3, 2)
    torch.testing.assert_close(nsp(pooled), pooled @ nsp.W + nsp.b, atol=1e-6, rtol=0)


@pytest.mark.parametrize("act_fn", ["gelu", "gelu_new", "relu"])
def test_mlm_head_uses_the_model_activation(act_fn):
    from hooked.components.activations import get_activation

    cfg = config(act_fn=act_fn)
    head = randomize(BertMLMHead(cfg))
    x = torch.randn(1, 3, 16)
    expected = F.layer_norm(get_activation(act_fn)(x @ head.W + head.b), (16,), head.ln.w, head.ln.b, eps=cfg.eps)
    torch.testing.assert_close(head(x), expected, atol=1e-6, rtol=0)
