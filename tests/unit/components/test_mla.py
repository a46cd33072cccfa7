"""Multi-head latent attention: weight views as products of its factors, the latent KV cache, folding.

On a tiny DeepSeek-V3 (`tests.tiny_models.ROUTED_CONFIGS`), float32, unprocessed unless said.
"""

from __future__ import annotations

import pytest
import torch

from hooked import HookedTransformer
from hooked.generation.kv_cache import HookedTransformerKeyValueCache
from tests.helpers import max_abs
from tests.tiny_models import hooked_from, tiny_routed, tokens

V3 = "deepseek_v3_group_limited"
ATOL = 1e-5


@pytest.fixture(scope="module")
def model():
    return hooked_from(tiny_routed(V3, seed=1))


def _attn_input(model, cache, layer: int) -> torch.Tensor:
    return model.blocks[layer].ln1(cache["resid_pre", layer])  # [batch, pos, d_model]: what attention reads


def test_q_k_v_are_the_views_times_the_latent_norm_scales(model):
    """`q = (x W_Q + b_Q) / s_q`, `v = (x W_V + b_V) / s_kv`, keys: non-rotary part `/ s_kv`, rotary part as is."""
    layer, nope = 1, model.cfg.d_head - model.cfg.rotary_dim
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens())
        x = _attn_input(model, cache, layer)
        s_q = cache[f"blocks.{layer}.attn.q_a_norm.hook_scale"][..., None]  # [batch, pos, 1, 1]
        s_kv = cache[f"blocks.{layer}.attn.kv_a_norm.hook_scale"][..., None]
        attn = model.blocks[layer].attn
        per_head = lambda W, b: torch.einsum("bpd,hde->bphe", x, W) + b  # noqa: E731
        assert max_abs(cache["q", layer], per_head(model.W_Q[layer], model.b_Q[layer]) / s_q) <= ATOL
        assert max_abs(cache["v", layer], per_head(model.W_V[layer], model.b_V[layer]) / s_kv) <= ATOL
        k = per_head(model.W_K[layer], model.b_K[layer])  # [batch, pos, head, d_head]
        assert max_abs(cache["k", layer][..., :nope], k[..., :nope] / s_kv) <= ATOL
        assert max_abs(cache["k", layer][..., nope:], k[..., nope:]) <= ATOL  # the shared key: one for every head
        assert torch.equal(k[..., nope:], k[..., :1, nope:].expand_as(k[..., nope:]))
    assert model.W_Q.shape == (2, 4, 32, 12) and model.W_V.shape == (2, 4, 32, 6) and model.W_O.shape == (2, 4, 6, 32)
    assert attn.W_KV_A.shape == (32, 16 + 4) and attn.W_KV_B.shape == (4, 16, 8 + 6)


def test_ov_and_qk_of_one_head_are_the_products_the_forward_computes(model):
    """At position 0 a query attends only to itself and rotary only scales by YaRN's factor `a`, so a head's
    output there is `x OV / s_kv` and its score `x (QK_nope / (s_q s_kv) + a^2 QK_rope / s_q) x^T / attn_scale`
    (b_* are 0 here)."""
    from hooked.components.rotary import rotary_attention_factor

    layer, head, nope = 1, 2, model.cfg.d_head - model.cfg.rotary_dim
    model.set_use_attn_result(True)
    try:
        with torch.no_grad():
            _, cache = model.run_with_cache(tokens())
    finally:
        model.set_use_attn_result(False)
    x0 = _attn_input(model, cache, layer)[:, 0]  # [batch, d_model]
    s_q = cache[f"blocks.{layer}.attn.q_a_norm.hook_scale"][:, 0]  # [batch, 1]
    s_kv = cache[f"blocks.{layer}.attn.kv_a_norm.hook_scale"][:, 0]
    OV, QK = model.OV[layer, head], model.QK[layer, head]
    assert max_abs(cache["result", layer][:, 0, head], (x0 @ OV.AB) / s_kv) <= ATOL
    W_Q, W_K = model.W_Q[layer, head], model.W_K[layer, head]
    QK_nope, QK_rope = W_Q[:, :nope] @ W_K[:, :nope].T, W_Q[:, nope:] @ W_K[:, nope:].T
    assert max_abs(QK_nope + QK_rope, QK.AB) <= ATOL
    bilinear = lambda M: torch.einsum("bd,de,be->b", x0, M, x0)  # noqa: E731
    a2 = rotary_attention_factor(model.cfg.rotary_scaling) ** 2
    assert a2 != 1.0  # YaRN with mscale != mscale_all_dim: the factor is exercised
    expected = (bilinear(QK_nope) / (s_q * s_kv)[:, 0] + a2 * bilinear(QK_rope) / s_q[:, 0]) / model.cfg.attn_scale
    assert max_abs(cache["attn_scores", layer][:, head, 0, 0], expected) <= ATOL


def test_circuits_and_per_head_attribution_run(model):
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens())
        scores = model.all_composition_scores("K")  # [layer, head, layer, head]
        heads, labels = cache.stack_head_results(layer=-1, return_labels=True)  # [heads, batch, pos, d_model]
    assert scores.shape == (2, 4, 2, 4) and scores[1].abs().sum() == 0 and scores[0, :, 1].abs().sum() > 0
    assert len(labels) == 8 and labels[0] == "L0H0"
    attn_out = sum(cache["attn_out", layer] for layer in range(2))
    b_O = sum(model.b_O[layer] for layer in range(2))
    assert max_abs(heads.sum(0) + b_O, attn_out) <= ATOL  # every head's write, per head


def test_the_cache_holds_the_latent_and_shared_key_not_per_head_keys(model):
    """Bytes per token per layer: (kv_lora_rank + rotary_dim) values, against heads * (d_head + d_value)."""
    t = tokens(1, 10)
    with torch.no_grad():
        _, full = model.run_with_cache(t, names_filter=lambda n: "kv_latent" in n or "rot_k_rope" in n)
        cache = HookedTransformerKeyValueCache.init_cache(model.cfg, "cpu", 1)
        model(t, past_kv_cache=cache)
    cfg, entry = model.cfg, cache[0]
    stored = sum(e.past_keys.numel() + e.past_values.numel() for e in cache.entries) * 4 // cache.n_cached
    assert stored == cfg.n_layers * (cfg.kv_lora_rank + cfg.rotary_dim) * 4 == 2 * 20 * 4  # bytes per token
    per_head = cfg.n_layers * cfg.n_heads * (cfg.d_head + cfg.d_value) * 4  # an ordinary cache of the same heads
    assert per_head == 2 * 4 * 18 * 4 and per_head / stored == 3.6
    assert torch.equal(entry.past_keys[:, :, 0], full["blocks.0.attn.hook_kv_latent"])
    assert torch.equal(entry.past_values[:, :, 0], full["blocks.0.attn.hook_rot_k_rope"])


def test_hooks_on_the_cached_path_see_the_full_forwards_values(model):
    names = ("q_latent", "hook_q", "kv_latent", "k_nope", "hook_k", "hook_rot_k", "hook_v", "hook_z", "rot_q")
    keep = lambda n: n.startswith("blocks.1.attn.") and n.endswith(names)  # noqa: E731
    t = tokens()
    with torch.no_grad():
        _, full = model.run_with_cache(t, names_filter=keep)
        cache, start = HookedTransformerKeyValueCache.init_cache(model.cfg, "cpu", 2), 0
        for n in (5, 1, 6):
            _, step = model.run_with_cache(t[:, start : start + n], past_kv_cache=cache, names_filter=keep)
            assert len(step) == len(names)
            for name, value in step.items():
                assert max_abs(value, full[name][:, start : start + n]) <= ATOL, (name, start)
            start += n


def test_an_edit_of_the_latent_is_cached_and_later_tokens_see_it(model):
    """Zeroing position 2's KV latent in layer 1: decoding through the cache equals the full forward with that edit."""

    def zero_position_2(latent, hook):
        columns = model.forward_state.query_column_ids()  # the key positions this forward writes
        return torch.where((columns == 2)[None, :, None], 0.0, latent)

    t = tokens()
    with torch.no_grad(), model.hooks(fwd_hooks=[("blocks.1.attn.hook_kv_latent", zero_position_2)]):
        edited = model(t)
        cache, start, chunks = HookedTransformerKeyValueCache.init_cache(model.cfg, "cpu", 2), 0, []
        for n in (3, 4, 5):
            chunks.append(model(t[:, start : start + n], past_kv_cache=cache))
            start += n
    assert max_abs(torch.cat(chunks, dim=1), edited) <= ATOL
    with torch.no_grad():
        assert max_abs(model(t)[:, 3:], edited[:, 3:]) > 1e-3  # later positions read the edited latent


def test_fold_ln_folds_the_input_and_latent_norms():
    hf = tiny_routed(V3, seed=1)
    model = HookedTransformer.from_pretrained("processed", hf_model=hf)
    state = model.state_dict()
    assert not any(k.endswith(("ln1.w", "q_a_norm.w", "kv_a_norm.w")) for k in state)
    attn = model.blocks[0].attn
    assert type(attn.kv_a_norm).__name__ == "RMSNormPre" and attn.kv_a_norm.eps == 1e-6
    assert "fold_value_biases" not in model.cfg.weight_processing  # MLA's values have no bias to fold
    with torch.no_grad():
        assert max_abs(model(tokens()).log_softmax(-1), hooked_from(hf)(tokens()).log_softmax(-1)) <= 1e-4


def test_generate_return_cache_equals_a_forward_over_the_fed_tokens(model):
    """Every cached hook of a KV-cached MLA `generate` equals `run_with_cache` on the tokens it fed."""
    out = model.generate(tokens(1, 5), max_new_tokens=4, do_sample=False, stop_at_eos=False, verbose=False,
                         return_cache=True)  # fmt: skip
    with torch.no_grad():
        _, full = model.run_with_cache(out.sequences[:, :-1])
    assert set(out.cache.keys()) == set(full.keys())
    for name, value in full.items():  # (masked scores are -inf in both)
        torch.testing.assert_close(out.cache[name], value, rtol=0, atol=ATOL, msg=name)


def test_dsa_indexer_scores_are_stitched_like_attention_scores():
    """DSA's `indexer.hook_scores` `[batch, query, key]`: -inf above the diagonal, equal to a full forward's."""
    dsa = hooked_from(tiny_routed("glm_moe_dsa_topk4", seed=1))
    out = dsa.generate(tokens(1, 5), max_new_tokens=4, do_sample=False, stop_at_eos=False, verbose=False,
                       return_cache=True, names_filter="blocks.0.attn.indexer.hook_scores")  # fmt: skip
    with torch.no_grad():
        _, full = dsa.run_with_cache(out.sequences[:, :-1], names_filter="blocks.0.attn.indexer.hook_scores")
    stitched, reference = out.cache["blocks.0.attn.indexer.hook_scores"], full["blocks.0.attn.indexer.hook_scores"]
    assert stitched.shape == (1, 8, 8) and torch.isinf(stitched.triu(1)[0, 0, 1:]).all()
    finite = reference.isfinite()
    assert torch.equal(finite, stitched.isfinite()) and max_abs(stitched[finite], reference[finite]) <= ATOL
