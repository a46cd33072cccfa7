"""The pieces Gemma 3n/4, MPT and HunYuan brought: each against HF's own function, or on a model from a config alone."""

from __future__ import annotations

import pickle

import pytest
import torch

from hooked import HookedTransformer, HookedTransformerConfig
from hooked.core.errors import ConfigError, InputError

torch.set_num_threads(1)

GEMMA_LIKE = dict(
    d_model=16, d_head=4, n_layers=3, n_ctx=16, d_vocab=50, d_mlp=32, act_fn="gelu_pytorch_tanh", gated_mlp=True,
    normalization_type="RMS", positional_embedding_type="rotary", use_normalization_before_and_after=True,
    use_qk_norm=True, use_v_norm=True, n_key_value_heads=2, kv_shared_from=[None, None, 0], d_per_layer_input=4,
    d_vocab_per_layer_input=40, seed=0,
)  # fmt: skip


def test_proportional_rotary_frequencies_are_hfs():
    from transformers import Gemma4TextConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from hooked.components.rotary import rotary_inv_freq

    hf = Gemma4TextConfig(head_dim=8, global_head_dim=32, num_hidden_layers=2, layer_types=["sliding_attention"] * 2)
    hf.rope_parameters["full_attention"]["factor"] = 2.0
    ref, _ = ROPE_INIT_FUNCTIONS["proportional"](hf, layer_type="full_attention")
    scaling = dict(rope_type="proportional", partial_rotary_factor=0.25, factor=2.0)
    ours = rotary_inv_freq(32, 1e6, scaling)
    assert torch.equal(ours, ref) and (ours[4:] == 0).all() and (ours[:4] > 0).all()


@pytest.mark.parametrize("n_heads", [4, 6, 12])
def test_mpt_alibi_slopes_are_hfs(n_heads):
    from transformers.models.mpt.modeling_mpt import build_mpt_alibi_tensor

    from hooked.components.alibi import mpt_alibi_slopes

    hf = build_mpt_alibi_tensor(n_heads, 5)  # [head, 1, key]: slope * (key - last key)
    assert torch.equal(mpt_alibi_slopes(n_heads, 8.0), -hf[:, 0, 0] / 4)


def test_gaussian_top_k_is_hfs():
    from transformers import Gemma3nTextConfig
    from transformers.models.gemma3n.modeling_gemma3n import Gemma3nTextMLP

    from hooked.components.activation_sparsity import gaussian_top_k

    hf = Gemma3nTextMLP(Gemma3nTextConfig(hidden_size=8, intermediate_size=64, num_hidden_layers=1), layer_idx=0)
    hf.activation_sparsity = 0.8
    gate = torch.randn(2, 5, 64, generator=torch.Generator().manual_seed(0))
    sparse = gaussian_top_k(gate, 0.8)
    assert torch.equal(sparse, hf._gaussian_topk(gate)) and 0.7 < (sparse == 0).float().mean() < 0.9


def test_layer_config_is_a_live_view_with_the_layers_shapes():
    cfg = HookedTransformerConfig(**{**GEMMA_LIKE, "layer_d_head": [4, 8, 4], "layer_d_mlp": [32, 64, 32]})
    layer = cfg.layer_config(1)
    assert (layer.d_head, layer.rotary_dim, layer.d_mlp, layer.n_heads, layer.n_kv_heads) == (8, 8, 64, 4, 2)
    assert cfg.layer_config(0) is cfg  # nothing differs there
    cfg.use_attn_result = True  # a switch flipped on the model's config reaches the layer
    assert layer.use_attn_result
    layer.attn_implementation = "eager"  # and a write through the view lands on the model's config
    assert cfg.attn_implementation == "eager"
    assert pickle.loads(pickle.dumps(layer)).d_head == 8


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (dict(kv_shared_from=[None, 2, None]), "earlier layer"),
        (dict(layer_d_head=[4, 8]), "one per layer"),
        (dict(d_vocab_per_layer_input=None), "set together"),
        (dict(layer_n_key_value_heads=[2, 2, 3]), r"layer_n_key_value_heads\[2\] = 3 must divide"),
        (dict(layer_d_head=[4, 4, 3]), "layer 2: rotary_dim"),  # a layer's full rotary on an odd width
        (dict(kv_shared_from=[None, 0, 1]), "borrows its own keys"),  # layer 1 computes none of its own
        (dict(layer_d_head=[8, 4, 4]), "its own shape"),  # layer 2 reads layer 0's 8-wide keys
        (dict(layer_n_key_value_heads=[4, 2, 2]), "its own shape"),
        (dict(attn_output_gate=True), "not supported with attn_output_gate"),  # the borrower has no gate
        (
            dict(kv_lora_rank=8, rotary_dim=2, d_head_v=4, use_qk_norm=False, use_v_norm=False),
            "not supported with kv_lora_rank",  # MLA lends a latent, not keys
        ),
    ],
)
def test_per_layer_fields_are_checked(fields, message):
    with pytest.raises(ConfigError, match=message):
        HookedTransformerConfig(**{**GEMMA_LIKE, **fields})


def test_a_kv_sharing_layer_attends_to_its_lenders_values():
    """Layer 2's output per head is its pattern times layer 0's normalized values (it has no values of its own)."""
    model = HookedTransformer(HookedTransformerConfig(**GEMMA_LIKE))
    t = torch.randint(0, 50, (2, 6), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        _, cache = model.run_with_cache(t)
        with pytest.raises(RuntimeError, match="lending layer"):
            model(cache["resid_pre", 1], start_at_layer=1, tokens=t)
    assert "blocks.2.attn.hook_k" not in model.hook_dict and "blocks.2.attn.hook_q" in model.hook_dict
    values = cache["blocks.0.attn.v_norm.hook_normalized"]  # [batch, pos, kv_head, d_head]
    assert values.shape == (2, 6, 2, 4)
    per_head = values.repeat_interleave(2, dim=2)  # [batch, pos, head, d_head]
    z = torch.einsum("bhqk,bkhd->bqhd", cache["pattern", 2], per_head)
    torch.testing.assert_close(z, cache["z", 2], atol=1e-6, rtol=0)


def test_per_layer_inputs_need_the_tokens():
    model = HookedTransformer(HookedTransformerConfig(**GEMMA_LIKE))
    embeds = torch.randn(1, 4, 16)
    with pytest.raises(InputError, match="per-layer inputs"):
        model(embeds)


def test_altup_streams_expand_to_the_embeddings_magnitude_and_collapse_to_their_mean():
    from hooked.components.altup import AltUpStreams

    cfg = HookedTransformerConfig(**{**GEMMA_LIKE, "altup_num_inputs": 3})
    streams = AltUpStreams(cfg)
    torch.nn.init.normal_(streams.W_up), torch.nn.init.normal_(streams.W_down)
    embed = torch.randn(2, 5, 16)
    expanded = streams.expand(embed)  # [batch, pos, stream, d_model]
    rms = expanded.pow(2).mean(-1).sqrt()  # [batch, pos, stream]
    assert expanded.shape == (2, 5, 3, 16) and torch.equal(expanded[:, :, 0], embed)
    torch.testing.assert_close(rms, rms[:, :, :1].expand_as(rms))
    collapsed = streams.collapse(expanded)
    assert collapsed.shape == (2, 5, 16)
