"""Mixture-of-experts families (Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE) against HuggingFace eager, float32.

Tiny random models with 4 experts and top-2 routing, every parameter redrawn (router
included, so routing is far from uniform); Qwen2-MoE has its sigmoid-gated shared
expert and OLMoE a full-width qk-norm with `clip_qkv` that actually clips. A live HF
model holds its experts fused (transformers 5); `save_pretrained` writes one Linear per
expert, so both checkpoint layouts are converted here. Bounds: docs/numerics.md#tolerances.
"""

from __future__ import annotations

import copy

import pytest
import torch

from tests.helpers import hf_block_outputs, max_abs
from tests.tiny_models import MOE_CONFIGS, NO_PROCESSING, hooked_from, tiny_hf, tiny_moe, tokens

ATOL = 1e-5


@pytest.fixture(params=list(MOE_CONFIGS), scope="module")
def pair(request):
    prefix, overrides = MOE_CONFIGS[request.param]
    hf = tiny_moe(prefix, seed=len(request.param), **overrides)
    return hf, hooked_from(hf)


# -- parity ------------------------------------------------------------------------------


def test_logits_and_every_resid_post_match_hf(pair):
    hf, model = pair
    t = tokens()
    ref = hf_block_outputs(hf, hf.model.layers, t)
    with torch.no_grad():
        logits, cache = model.run_with_cache(t, names_filter=lambda n: n.endswith("hook_resid_post"))
        assert max_abs(logits, hf(t).logits) <= ATOL
    for layer, hidden in enumerate(ref):
        assert max_abs(cache["resid_post", layer], hidden) <= ATOL, f"layer {layer}"


def test_processed_matches_hf_and_unprocessed_and_is_idempotent(pair):
    """fold_ln folds ln2 into the router(s) and every expert; log-probs stay those of HF."""
    from hooked import HookedTransformer

    hf, unprocessed = pair
    model = HookedTransformer.from_pretrained("processed", hf_model=hf)
    assert "fold_ln" in model.cfg.weight_processing and model.cfg.normalization_type == "RMSPre"
    assert not any(k.endswith(("ln1.w", "ln2.w")) for k in model.state_dict())
    t = tokens()
    with torch.no_grad():
        ours = model(t).log_softmax(-1)
        assert max_abs(ours, hf(t).logits.log_softmax(-1)) <= ATOL
        assert max_abs(ours, unprocessed(t).log_softmax(-1)) <= ATOL
        before = {k: v.clone() for k, v in model.state_dict().items()}
        model.process_weights_()
    after = model.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)


def test_kv_cached_decoding_equals_full_forward(pair):
    from hooked.generation.kv_cache import HookedTransformerKeyValueCache

    _, model = pair
    t = tokens()
    with torch.no_grad():
        full = model(t)
        cache, start = HookedTransformerKeyValueCache.init_cache(model.cfg, model.cfg.device, 2), 0
        for n in (5, 1, 6):
            chunk = model(t[:, start : start + n], past_kv_cache=cache)
            assert max_abs(chunk, full[:, start : start + n]) <= ATOL
            start += n


def test_greedy_20_tokens_match_hf(pair):
    hf, model = pair
    t = tokens(1, 6, seed=3)
    with torch.no_grad():
        ref = hf.generate(t, attention_mask=torch.ones_like(t), max_new_tokens=20, do_sample=False, eos_token_id=None)
    ours = model.generate(t, max_new_tokens=20, do_sample=False, stop_at_eos=False, verbose=False)
    assert torch.equal(ours, ref)


# -- router and expert hooks -------------------------------------------------------------


def test_cached_router_weights_equal_hf_router_softmax(pair):
    hf, model = pair
    t = tokens()
    with torch.no_grad():
        router_logits = hf(t, output_router_logits=True).router_logits  # per layer [batch * pos, experts]
        _, cache = model.run_with_cache(t, names_filter=lambda n: "hook_expert" in n)
    E, k = model.cfg.num_experts, model.cfg.experts_per_token
    for layer, logits in enumerate(router_logits):
        weights = cache[f"blocks.{layer}.mlp.hook_expert_weights"]
        assert weights.shape == (2, 12, E) and weights.dtype == torch.float32
        assert max_abs(weights, logits.float().softmax(-1).view(2, 12, E)) <= 1e-6
        indices = cache[f"blocks.{layer}.mlp.hook_expert_indices"]
        assert indices.shape == (2, 12, k)
        assert torch.equal(indices.sort(-1).values, weights.topk(k, -1).indices.sort(-1).values)


def test_expert_hooks_fire_with_the_routed_tokens(pair):
    _, model = pair
    t = tokens()
    with torch.no_grad():
        _, cache = model.run_with_cache(t, names_filter=lambda n: "blocks.0.mlp." in n)
    indices, d_mlp = cache["blocks.0.mlp.hook_expert_indices"], model.cfg.d_mlp
    for e in range(model.cfg.num_experts):
        n_e = int((indices == e).sum())
        for name in ("hook_gate", "hook_pre", "hook_post"):
            assert cache[f"blocks.0.mlp.experts.{e}.{name}"].shape == (n_e, d_mlp)
        assert cache[f"blocks.0.mlp.experts.{e}.hook_out"].shape == (n_e, model.cfg.d_model)
    logits = cache["blocks.0.mlp.hook_router_logits"]  # [batch, pos, experts]
    assert max_abs(logits.float().softmax(-1), cache["blocks.0.mlp.hook_expert_weights"]) <= 1e-6


def test_left_padded_batch_equals_each_prompt_alone(pair):
    """Pad tokens are routed too, but never reach a real token: each row equals the prompt run alone."""
    _, model = pair
    seqs = [tokens(1, n, seed=n)[0] for n in (5, 12, 9)]
    toks, mask = torch.zeros(3, 12, dtype=torch.long), torch.zeros(3, 12, dtype=torch.long)
    for i, s in enumerate(seqs):
        toks[i, 12 - len(s) :], mask[i, 12 - len(s) :] = s, 1
    with torch.no_grad():
        batched = model(toks, attention_mask=mask)
        for i, s in enumerate(seqs):
            assert max_abs(batched[i, -len(s) :], model(s[None])[0]) <= ATOL, f"row {i}"


def test_ablating_an_expert_by_hook_equals_zeroing_its_weights(pair):
    _, model = pair
    t = tokens()
    with torch.no_grad():
        _, cache = model.run_with_cache(t, names_filter="blocks.1.mlp.hook_expert_indices")
        expert = int(cache["blocks.1.mlp.hook_expert_indices"].flatten().mode().values)  # the busiest expert
        clean = model(t)
        hooked = model.run_with_hooks(
            t, fwd_hooks=[(f"blocks.1.mlp.experts.{expert}.hook_post", lambda x, hook: torch.zeros_like(x))]
        )
        zeroed = copy.deepcopy(model)
        zeroed.blocks[1].mlp.experts[expert].W_out.weight.zero_()
        assert max_abs(hooked, zeroed(t)) <= ATOL
        assert max_abs(hooked, clean) > 1e-3  # the ablation did something


def test_forcing_experts_through_the_indices_hook(pair):
    """Replacing the chosen ids routes every token to experts 0 and 1, weighted by their probs."""
    _, model = pair
    mlp, t = model.blocks[0].mlp, tokens()
    x = torch.randn(2, 12, model.cfg.d_model, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        forced = torch.tensor([0, 1]).expand(2, 12, 2)
        out = model.run_with_hooks(t, fwd_hooks=[("blocks.0.mlp.hook_expert_indices", lambda i, hook: forced)])
        assert out.isfinite().all()
        mlp.hook_expert_indices.add_hook(lambda i, hook: forced)
        try:
            ours = mlp(x)
        finally:
            mlp.hook_expert_indices.remove_hooks()
        probs = torch.softmax(mlp.W_gate(x), -1)[..., :2]
        if model.cfg.norm_topk_prob:
            probs = probs / probs.sum(-1, keepdim=True)
        expected = probs[..., :1] * mlp.experts[0](x) + probs[..., 1:] * mlp.experts[1](x)
        if hasattr(mlp, "shared_expert"):
            expected = expected + torch.sigmoid(mlp.shared_expert_gate(x)) * mlp.shared_expert(x)
        assert max_abs(ours, expected) <= ATOL


# -- loading -----------------------------------------------------------------------------


def test_loads_per_expert_checkpoint_from_disk(pair, tmp_path):
    """`save_pretrained` writes one Linear per expert (Mixtral: `block_sparse_moe.experts.{e}.w1`)."""
    from safetensors import safe_open

    from hooked import HookedTransformer

    hf, _ = pair
    hf.save_pretrained(tmp_path, safe_serialization=True)
    fused_on_disk = type(hf).__name__ == "GptOssForCausalLM"  # GPT-OSS checkpoints are fused on disk too
    with safe_open(tmp_path / "model.safetensors", "pt") as f:
        layout = ".experts.gate_up_proj" if fused_on_disk else ".experts.0."
        assert any(layout in key for key in f.keys())  # noqa: SIM118 - safe_open has keys() but no __iter__
    model = HookedTransformer.from_pretrained(str(tmp_path), **NO_PROCESSING)
    t = tokens()
    with torch.no_grad():
        assert max_abs(model(t), hf(t).logits) <= ATOL


def test_converted_moe_config(pair):
    hf, model = pair
    cfg = model.cfg
    assert (cfg.num_experts, cfg.experts_per_token) == (4, 2)
    is_mixtral = type(hf).__name__ == "MixtralForCausalLM"
    assert cfg.norm_topk_prob == (True if is_mixtral else getattr(hf.config, "norm_topk_prob", True))
    assert cfg.shared_expert_d_mlp == getattr(hf.config, "shared_expert_intermediate_size", None)
    assert cfg.full_width_qk_norm == (type(hf).__name__ == "OlmoeForCausalLM")


def test_dense_layers_in_a_moe_model_are_rejected():
    hf = tiny_moe("Qwen2Moe", **dict(MOE_CONFIGS["qwen2_moe_shared_expert"][1], mlp_only_layers=[1]))
    with pytest.raises(NotImplementedError, match="dense MLP"):
        hooked_from(hf)


def test_olmoe_clip_qkv_clips():
    """Guard against a vacuous clip: the same model without clip_qkv gives different logits."""
    prefix, overrides = MOE_CONFIGS["olmoe_clip_qkv"]
    clipped = tiny_moe(prefix, seed=1, **overrides)
    model = hooked_from(clipped)
    clipped.config.clip_qkv = None
    t = tokens()
    with torch.no_grad():
        assert max_abs(model(t), clipped(t).logits) > 1e-2


def test_full_width_qk_norm_with_gqa_grouped_and_ungrouped():
    """OLMoE-style k_norm over n_kv_heads * d_head: HF parity under GQA, and the ungrouped keys agree."""
    hf = tiny_moe("Olmoe", seed=2, **dict(MOE_CONFIGS["olmoe_clip_qkv"][1], num_key_value_heads=2))
    model, t = hooked_from(hf), tokens()
    assert model.blocks[0].attn.k_norm.w.shape == (2 * model.cfg.d_head,)
    with torch.no_grad():
        grouped, cache = model.run_with_cache(t, names_filter="blocks.0.attn.q_norm.hook_normalized")
        assert cache["blocks.0.attn.q_norm.hook_normalized"].shape == (2, 12, model.cfg.n_heads * model.cfg.d_head)
        assert max_abs(grouped, hf(t).logits) <= ATOL
        model.set_ungroup_grouped_query_attention(True)
        assert max_abs(model(t), grouped) <= ATOL


def test_gpt_oss_sinks_and_clamp_matter():
    """Guard against vacuous GPT-OSS parity: without sinks, or with a clamp that never bites, logits change."""
    prefix, overrides = MOE_CONFIGS["gpt_oss_sinks_clamped_swiglu"]
    model, t = hooked_from(tiny_hf(prefix, seed=1, **overrides)), tokens()
    unclamped = hooked_from(tiny_hf(prefix, seed=1, **dict(overrides, swiglu_limit=1e4)))
    with torch.no_grad():
        assert max_abs(model(t), unclamped(t)) > 1e-3
        _, cache = model.run_with_cache(t, names_filter="blocks.0.attn.hook_pattern")
    assert (cache["pattern", 0].sum(-1) < 1 - 1e-3).any()  # the sink takes part of each row


def test_stacked_mlp_weights_point_to_the_experts(pair):
    _, model = pair
    for name in ("W_in", "W_out", "W_gate"):
        with pytest.raises(NotImplementedError, match=f"experts\\[e\\].{name}.weight"):
            getattr(model, name)
    assert model.W_Q.shape[0] == model.cfg.n_layers  # attention weights still stack


def test_configs_cover_every_moe_family():
    """The parity configs above build each of these HF classes (removing a family's last config fails here)."""
    families = {
        "GptOssForCausalLM",
        "MixtralForCausalLM",
        "OlmoeForCausalLM",
        "Qwen2MoeForCausalLM",
        "Qwen3MoeForCausalLM",
    }
    assert {prefix + "ForCausalLM" for prefix, _ in MOE_CONFIGS.values()} == families
