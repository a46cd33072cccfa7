"""ActivationCache basics and get_act_name shorthands."""

import pytest
import torch

from hooked import HookedTransformer, HookedTransformerConfig
from hooked.core.utils import get_act_name


@pytest.mark.parametrize(
    "args, name",
    [
        (("pattern", 0), "blocks.0.attn.hook_pattern"),
        (("attn", 3), "blocks.3.attn.hook_pattern"),
        (("k6",), "blocks.6.attn.hook_k"),
        (("scale4ln1",), "blocks.4.ln1.hook_scale"),
        (("scale", 4, "ln1"), "blocks.4.ln1.hook_scale"),
        (("scale",), "ln_final.hook_scale"),
        (("resid_pre", 2), "blocks.2.hook_resid_pre"),
        (("mlp_post", 1), "blocks.1.mlp.hook_post"),
        (("pre", 1), "blocks.1.mlp.hook_pre"),
        (("attn_logits", 0), "blocks.0.attn.hook_attn_scores"),
        (("value", 1, "a"), "blocks.1.attn.hook_v"),
        (("embed",), "hook_embed"),
        (("blocks.0.hook_resid_pre",), "blocks.0.hook_resid_pre"),
        (("resid_mid", 0, "b"), "blocks.0.hook_resid_mid"),
    ],
)
def test_get_act_name(args, name):
    assert get_act_name(*args) == name


def test_cache_indexing_batch_and_device():
    model = HookedTransformer(
        HookedTransformerConfig(d_model=16, d_head=4, n_layers=3, n_ctx=16, act_fn="relu", d_vocab=20, seed=0)
    )
    toks = torch.randint(0, 20, (1, 5))
    _, cache = model.run_with_cache(toks)
    torch.testing.assert_close(cache["resid_pre", -1], cache["blocks.2.hook_resid_pre"], atol=0, rtol=0)
    assert cache["k2"] is cache["blocks.2.attn.hook_k"]
    assert ("pattern", 1) in cache and "blocks.1.attn.hook_pattern" in cache and len(cache) == len(list(cache))
    assert torch.equal(cache.tokens, toks) and cache.attention_mask is None
    with pytest.raises(KeyError, match="not in the cache"):
        cache["result", 0]
    cache.remove_batch_dim()
    assert cache["resid_post", 0].shape == (5, 16) and not cache.has_batch_dim
    moved = cache.to("cpu")
    assert moved["scale"].device.type == "cpu"
