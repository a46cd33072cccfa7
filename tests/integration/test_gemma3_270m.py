"""The second bundled real model, Gemma-3-270M (base, float32), against HuggingFace on real text,
and the analysis toolkit on it.

Gemma 3 exercises what SmolLM2 does not: (1 + w) norms, sandwich norms, qk-norm, the
embedding scale, 5 local : 1 global layers with their own rope bases, and a 512-token
window (one test runs 547 tokens so the window bites). The vocabulary is 262,144, so
batches are small and long rows keep only their last logits.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

from tests.conftest import TEXTS

pytestmark = pytest.mark.slow  # needs the bundled model (make venv installs the gemma3 GGUF packages); never skipped

N_POS = 64


@pytest.fixture(scope="module")
def batch(gemma3):
    """4 x 64 tokens of varied real text (prose, code, science, narrative), BOS first."""
    rows = [gemma3.to_tokens(t)[0, :N_POS] for t in TEXTS]
    return torch.stack(rows)


def hf_log_probs(hf, tokens, implementation, **kwargs):
    hf.set_attn_implementation(implementation)
    try:
        with torch.no_grad():
            return F.log_softmax(hf(tokens, **kwargs).logits, dim=-1)
    finally:
        hf.set_attn_implementation("eager")


def hooked_log_probs(model, tokens, implementation="auto", **kwargs):
    model.cfg.attn_implementation = implementation
    try:
        with torch.no_grad():
            return F.log_softmax(model(tokens, **kwargs), dim=-1)
    finally:
        model.cfg.attn_implementation = "auto"


@pytest.fixture(scope="module")
def hf_reference(gemma3_hf, batch):
    eager = hf_log_probs(gemma3_hf, batch, "eager")
    delta_hf = (eager - hf_log_probs(gemma3_hf, batch, "sdpa")).abs().max().item()
    return eager, delta_hf


# -- parity ------------------------------------------------------------------------------


@pytest.mark.parametrize("implementation", ["eager", "auto"])
def test_log_softmax_within_hf_own_eager_vs_sdpa_gap(gemma3, batch, hf_reference, implementation):
    """Real-model parity, unprocessed (docs/numerics.md#tolerances): <= max(delta_HF, 5e-5) against HF eager."""
    eager, delta_hf = hf_reference
    gemma3.cfg.attn_implementation = implementation
    try:
        with torch.no_grad():
            logits, loss = gemma3(batch, return_type="both")
    finally:
        gemma3.cfg.attn_implementation = "auto"
    ours = F.log_softmax(logits, dim=-1)
    diff = (ours - eager).abs().max().item()
    hf_loss = -eager[:, :-1].gather(-1, batch[:, 1:, None]).mean()  # HF's cross-entropy on the same log-probs
    print(
        f"\n[{implementation}] max |log_softmax(hooked) - log_softmax(HF eager)| = {diff:.3e}; "
        f"HF eager vs SDPA = {delta_hf:.3e}"
    )
    assert diff <= max(delta_hf, 5e-5)
    assert (ours.argmax(-1) == eager.argmax(-1)).all()
    assert abs(loss.item() - hf_loss.item()) <= 1e-4


def test_past_the_sliding_window(gemma3, gemma3_hf):
    """547 tokens: the local layers' 512-token window cuts in; the last 32 positions are compared."""
    tokens = gemma3.to_tokens(" ".join(TEXTS))
    assert tokens.shape[1] > gemma3.cfg.window_size + 32
    eager = hf_log_probs(gemma3_hf, tokens, "eager", logits_to_keep=32)
    delta_hf = (eager - hf_log_probs(gemma3_hf, tokens, "sdpa", logits_to_keep=32)).abs().max().item()
    ours = hooked_log_probs(gemma3, tokens, logits_to_keep=32)
    diff = (ours - eager).abs().max().item()
    print(f"\n547 tokens, last 32: hooked vs HF eager {diff:.3e}; HF eager vs SDPA {delta_hf:.3e}")
    assert diff <= max(delta_hf, 5e-5)


def test_processed_model_is_invariant(gemma3, gemma3_processed, batch, hf_reference):
    """Folding invariance on real models (docs/numerics.md#tolerances): log_softmax(processed) vs unprocessed
    within max(delta_HF, 1e-4). Gemma's large residual makes float32 reordering visible: HF's own eager and SDPA
    paths differ by delta_HF (1.2e-4 here), and folding the (1 + w) gains reorders as many products."""
    eager, delta_hf = hf_reference
    processed = hooked_log_probs(gemma3_processed, batch)
    unprocessed = hooked_log_probs(gemma3, batch)
    vs_unprocessed = (processed - unprocessed).abs().max().item()
    print(
        f"\nprocessed vs unprocessed {vs_unprocessed:.3e}; "
        f"processed vs HF eager {(processed - eager).abs().max():.3e}; "
        f"HF eager vs SDPA {delta_hf:.3e}"
    )
    assert vs_unprocessed <= max(delta_hf, 1e-4)
    assert gemma3_processed.cfg.weight_processing == ("fold_ln", "center_unembed", "fold_value_biases")


def test_paris_in_top_3(gemma3_processed):
    logits = gemma3_processed("The capital of France is")
    top3 = [gemma3_processed.to_single_str_token(int(i)) for i in logits[0, -1].topk(3).indices]
    print(f"\ntop 3 after 'The capital of France is': {top3}")
    assert " Paris" in top3


def test_greedy_32_tokens_match_hf(gemma3, gemma3_hf):
    prompts = ["The capital of France is", "def fibonacci(n):"]
    tokens, mask = gemma3.to_tokens(prompts, padding_side="left", return_attention_mask=True)
    eos = gemma3.tokenizer.eos_token_id
    ours = gemma3.generate(
        tokens, max_new_tokens=32, attention_mask=mask, do_sample=False, eos_token_id=eos, verbose=False
    )
    with torch.inference_mode():
        theirs = gemma3_hf.generate(
            tokens, attention_mask=mask, max_new_tokens=32, do_sample=False, eos_token_id=eos, pad_token_id=eos
        )
    print("\n" + "\n".join(gemma3.to_string(ours[:, tokens.shape[1] :])))
    assert torch.equal(ours, theirs)


def test_chunked_kv_cache_equals_full_forward(gemma3):
    from hooked.generation.kv_cache import HookedTransformerKeyValueCache

    tokens = gemma3.to_tokens(TEXTS[1])[:, :40]
    with torch.no_grad():
        full = gemma3(tokens)
        cache = HookedTransformerKeyValueCache.init_cache(gemma3.cfg, gemma3.cfg.device, 1)
        chunks = [gemma3(tokens[:, a:b], past_kv_cache=cache) for a, b in ((0, 25), (25, 26), (26, 40))]
    assert (torch.cat(chunks, dim=1) - full).abs().max().item() <= 1e-4


# -- analysis ----------------------------------------------------------------------------

PROMPTS = ["When Mary and John went to the store, John gave a drink to", "The capital of France is the city of"]


@pytest.fixture(scope="module")
def run(gemma3_processed):
    model = gemma3_processed
    tokens, mask = model.to_tokens(PROMPTS, padding_side="left", return_attention_mask=True)
    with torch.no_grad():
        logits, cache = model.run_with_cache(tokens, attention_mask=mask)
    return model, tokens, mask, logits, cache


def test_run_with_cache_is_transparent_and_has_every_hook(run):
    model, tokens, mask, logits, cache = run
    with torch.no_grad():  # caching only reads: the output keeps the plain forward's (fast) path
        assert torch.equal(model(tokens, attention_mask=mask), logits)
    for name in (
        "blocks.5.ln1_post.hook_scale",
        "blocks.5.ln2_post.hook_normalized",
        "blocks.5.attn.q_norm.hook_scale",
    ):
        assert name in cache
    assert cache["pattern", 0].shape == (2, model.cfg.n_heads, tokens.shape[1], tokens.shape[1])


def test_decompose_resid_logit_lens_and_logit_attrs_sum_exactly(run):
    """Whole-sublayer decompositions stay exact with sandwich norms: hook_attn_out is what was added."""
    model, _, _, logits, cache = run
    final = cache["resid_post", model.cfg.n_layers - 1][:, -1]
    correct = torch.tensor([model.to_single_token(" Mary"), model.to_single_token(" Paris")])
    wrong = torch.tensor([model.to_single_token(" John"), model.to_single_token(" London")])
    with torch.no_grad():
        stack = cache.decompose_resid(pos_slice=-1)
        lens = cache.logit_lens(pos_slice=-1)
        attrs = cache.logit_attrs(stack, correct, wrong, pos_slice=-1)
    rows = torch.arange(2)
    diff = logits[rows, -1, correct] - logits[rows, -1, wrong]
    errors = {
        "decompose_resid": (stack.sum(0) - final).abs().max().item() / final.abs().max().item(),
        "logit_lens[-1] vs logits": (lens[-1] - logits[:, -1]).abs().max().item(),
        "logit_attrs vs logit difference": (attrs.sum(0) - diff).abs().max().item(),
    }
    print("\n" + "\n".join(f"{k}: {v:.2e}" for k, v in errors.items()))
    assert max(errors.values()) <= 1e-4


def test_per_head_and_per_neuron_results_sum_to_sublayer_outputs_behind_post_norms(run):
    """Heads and neurons go through ln1_post / ln2_post with the cached scale frozen: they sum to what was added."""
    model, _, _, logits, cache = run
    H, d_mlp, L = model.cfg.n_heads, model.cfg.d_mlp, model.cfg.n_layers
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        heads = cache.stack_head_results(layer=-1, pos_slice=-1)  # [L * H, batch, d_model]
        neurons = cache.stack_neuron_results(layer=3, pos_slice=-1)  # [3 * d_mlp, batch, d_model]
    errors = {}
    for layer_i in range(L):
        attn_out = cache["attn_out", layer_i][:, -1]
        errors[f"heads {layer_i}"] = (
            heads[layer_i * H : (layer_i + 1) * H].sum(0) - attn_out
        ).abs().max().item() / attn_out.abs().max().item()
    for layer_i in range(3):
        mlp_out = cache["mlp_out", layer_i][:, -1]
        errors[f"neurons {layer_i}"] = (
            neurons[layer_i * d_mlp : (layer_i + 1) * d_mlp].sum(0) - mlp_out
        ).abs().max().item() / mlp_out.abs().max().item()
    assert max(errors.values()) <= 1e-4, errors

    answer = torch.tensor([model.to_single_token(" Mary"), model.to_single_token(" Paris")])
    stack = cache.get_full_resid_decomposition(pos_slice=-1, expand_neurons=False)
    attrs = cache.logit_attrs(stack, answer, pos_slice=-1)  # [component, batch]
    logit = logits[torch.arange(2), -1, answer]
    assert model.cfg.output_logits_soft_cap <= 0  # Gemma 3 has no final soft cap: logits are linear in the stream
    assert (attrs.sum(0) - logit).abs().max().item() <= 1e-3 * logit.abs().max().item()
    head_attrs = cache.logit_attrs(heads, answer, pos_slice=-1)[:, 0]  # [L * H]: " Mary" after the IOI prompt
    top = head_attrs.topk(3).values
    print(f"\ntop head attributions to ' Mary' (logit {logit[0].item():.2f}): {[round(v, 2) for v in top.tolist()]}")
    assert top[0] > 1.0  # heads' shares are on the logit's scale, not ~0.1 as before the post norm


def test_activation_patching_and_hooked_generation(gemma3_processed):
    from hooked import utils
    from hooked.analysis import patching

    model = gemma3_processed
    clean = model.to_tokens("The capital of France is the city of")
    corrupted = model.to_tokens("The capital of Italy is the city of")
    assert clean.shape == corrupted.shape and (clean != corrupted).sum() == 1  # only " France" / " Italy" differ
    paris = model.to_single_token(" Paris")
    metric = lambda logits: logits[0, -1, paris]  # noqa: E731
    with torch.no_grad():
        _, clean_cache = model.run_with_cache(clean, names_filter="blocks.0.hook_resid_pre")
        rows = torch.tensor([[0, 4], [0, 3]])  # (layer, pos): " France"/" Italy", then an identical " of"
        out = patching.generic_activation_patch(
            model, corrupted, clean_cache, metric, patching.layer_pos_patch_setter, "resid_pre", index_df=rows
        )
        clean_value, corrupted_value = metric(model(clean)).item(), metric(model(corrupted)).item()
    print(f"\nlogit(' Paris'): clean {clean_value:.3f}, corrupted {corrupted_value:.3f}, patched {out.tolist()}")
    assert clean_value - corrupted_value > 1.0
    assert abs(out[0].item() - clean_value) <= 1e-3  # patching the country back restores the clean run
    assert abs(out[1].item() - corrupted_value) <= 1e-3  # patching an identical token changes nothing

    prompt = model.to_tokens("The capital of France is")
    run = dict(max_new_tokens=6, do_sample=False, verbose=False, stop_at_eos=False, output_logits=True)
    plain = model.generate(prompt, **run)
    zero_mlp = [("blocks.3.hook_mlp_out", utils.at_steps(lambda x, hook: x * 0, steps=[0]))]
    ablated = model.generate(prompt, fwd_hooks=zero_mlp, **run)
    assert not torch.allclose(ablated.logits[0], plain.logits[0])  # step 0 (prefill) was ablated
    assert not model.blocks[3].hook_mlp_out.has_hooks()  # and the hook is gone afterwards


# -- the conversion ------------------------------------------------------------------------


def test_norm_gains_are_the_gguf_values(gemma3, gemma3_dir, tmp_path, monkeypatch):
    """llama.cpp stores Gemma's gains as 1 + w; the checkpoint holds HF's w; hooked's ln*.w is 1 + w again."""
    import numpy as np
    from gguf import GGUFReader
    from safetensors import safe_open

    from hooked.loading.bundled import CACHE_DIR_ENV, locate_bundled_gguf

    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path))  # assemble the chunks afresh, out of the shared cache
    tensors = {t.name: t for t in GGUFReader(locate_bundled_gguf("gemma-3-270m")).tensors}
    checkpoint = safe_open(gemma3_dir / "model.safetensors", "pt")
    pairs = {  # GGUF name: (HF name, hooked parameter)
        "blk.0.attn_norm.weight": ("model.layers.0.input_layernorm.weight", gemma3.blocks[0].ln1.w),
        "blk.4.post_attention_norm.weight": (
            "model.layers.4.post_attention_layernorm.weight",
            gemma3.blocks[4].ln1_post.w,
        ),
        "blk.5.ffn_norm.weight": ("model.layers.5.pre_feedforward_layernorm.weight", gemma3.blocks[5].ln2.w),
        "blk.5.post_ffw_norm.weight": ("model.layers.5.post_feedforward_layernorm.weight", gemma3.blocks[5].ln2_post.w),
        "blk.17.attn_q_norm.weight": ("model.layers.17.self_attn.q_norm.weight", gemma3.blocks[17].attn.q_norm.w),
        "output_norm.weight": ("model.norm.weight", gemma3.ln_final.w),
    }
    for gguf_name, (hf_name, ours) in pairs.items():
        raw = torch.from_numpy(np.array(tensors[gguf_name].data, dtype=np.float32))
        assert torch.equal(checkpoint.get_tensor(hf_name) + 1, raw), gguf_name
        assert torch.equal(ours.detach(), raw), gguf_name
