"""TransformerLens's Main Demo and Exploratory Analysis Demo, the code paths as the demos write them, on a tiny
GPT-2 standing in for GPT-2 small (`from_pretrained("gpt2-small", ...)`, same processing by default).

Loss, caching and the cache shorthands, tokenization helpers, head ablation with hooks, residual stream
patching by hand, `FactoredMatrix` and the OV/QK circuits, `generate`, a `HookedRootModule` of one's own, the
logit lens with `accumulated_resid(..., apply_ln=True)`, and head output and pattern patching. Each result is
compared with what it must equal: the loss with the cross-entropy of the logits, a shorthand with the full
hook name, a hand loop with the library's patching grid, a factored product with the dense one, the logit
lens's last layer with the logits.
"""

from __future__ import annotations

import itertools
from functools import partial

import pytest
import torch
import torch.nn as nn

CLEAN_PROMPT = "After John and Mary went to the store, Mary gave a bottle of milk to"
CORRUPTED_PROMPT = "After John and Mary went to the store, John gave a bottle of milk to"
GPT2_TEXT = "Natural language processing tasks are typically approached with supervised learning."


@pytest.fixture
def model(lens, gpt2_hf, course_tokenizer):
    return lens.HookedTransformer.from_pretrained(
        "gpt2-small", hf_model=gpt2_hf, tokenizer=course_tokenizer, device="cpu"
    )


def test_loss_cache_shorthands_and_tokens(model, lens):
    gpt2_tokens = model.to_tokens(GPT2_TEXT)
    loss = model(GPT2_TEXT, return_type="loss")
    logits = model(GPT2_TEXT, return_type="logits")
    log_probs = logits.log_softmax(-1)[:, :-1].gather(-1, gpt2_tokens[:, 1:, None])  # next-token log probs
    torch.testing.assert_close(loss, -log_probs.mean())

    gpt2_logits, gpt2_cache = model.run_with_cache(gpt2_tokens, remove_batch_dim=True)
    attention_pattern = gpt2_cache["pattern", 0, "attn"]
    gpt2_str_tokens = model.to_str_tokens(GPT2_TEXT)
    n = len(gpt2_str_tokens)
    assert attention_pattern.shape == (model.cfg.n_heads, n, n) and gpt2_str_tokens[0] == "<|endoftext|>"
    torch.testing.assert_close(attention_pattern.sum(-1), torch.ones(model.cfg.n_heads, n))
    assert (attention_pattern.triu(1) == 0).all()  # causal
    for short, full in [
        (("pattern", 0, "attn"), "blocks.0.attn.hook_pattern"), (("attn", 1), "blocks.1.attn.hook_pattern"),
        ("embed", "hook_embed"), ("pos_embed", "hook_pos_embed"), (("resid_pre", -1), "blocks.1.hook_resid_pre"),
        ("q0", "blocks.0.attn.hook_q"), ("scale1ln2", "blocks.1.ln2.hook_scale"), ("scale", "ln_final.hook_scale"),
        (("normalized", 1, "ln1"), "blocks.1.ln1.hook_normalized"),
    ]:  # fmt: skip
        assert gpt2_cache[short] is gpt2_cache[full]
        assert lens.utils.get_act_name(*short) if isinstance(short, tuple) else lens.utils.get_act_name(short) == full

    # ARENA 1.2's check of the cache: the pattern from q and k
    q, k = gpt2_cache["q", 0], gpt2_cache["k", 0]
    seq, nhead, headsize = q.shape
    scores = torch.einsum("qnh,knh->nqk", q, k).masked_fill(torch.triu(torch.ones(seq, seq, dtype=torch.bool), 1), -1e9)
    torch.testing.assert_close(gpt2_cache["pattern", 0], (scores / headsize**0.5).softmax(-1))

    example_text = "The quick brown fox jumps over the lazy dog."
    str_tokens = model.to_str_tokens(example_text, prepend_bos=False)
    assert "".join(str_tokens) == example_text
    tokens = model.to_tokens(example_text)
    assert tokens.shape == (1, len(str_tokens) + 1) and model.to_string(tokens[0, 1:]) == example_text
    assert model.to_string(tokens) == ["<|endoftext|>" + example_text]
    fox = model.to_single_token(" fox")
    assert model.get_token_position(" fox", example_text) == tokens[0].tolist().index(fox)


def logits_to_logit_diff(model, logits, correct_answer=" John", incorrect_answer=" Mary"):
    correct_index = model.to_single_token(correct_answer)
    incorrect_index = model.to_single_token(incorrect_answer)
    return logits[0, -1, correct_index] - logits[0, -1, incorrect_index]


def test_head_ablation_and_residual_stream_patching(model, lens):
    utils = lens.utils
    gpt2_tokens = model.to_tokens(GPT2_TEXT)
    layer_to_ablate, head_index_to_ablate = 0, 3

    def head_ablation_hook(value, hook):
        value[:, :, head_index_to_ablate, :] = 0.0
        return value

    original_loss = model(gpt2_tokens, return_type="loss")
    ablated_loss = model.run_with_hooks(
        gpt2_tokens, return_type="loss", fwd_hooks=[(utils.get_act_name("v", layer_to_ablate), head_ablation_hook)]
    )
    assert ablated_loss != original_loss
    # the value biases are folded into b_O, so zero values are a zero head output: the same as ablating z
    via_z = model.run_with_hooks(
        gpt2_tokens, return_type="loss", fwd_hooks=[(utils.get_act_name("z", layer_to_ablate), head_ablation_hook)]
    )
    torch.testing.assert_close(ablated_loss, via_z)

    clean_tokens, corrupted_tokens = model.to_tokens(CLEAN_PROMPT), model.to_tokens(CORRUPTED_PROMPT)
    clean_logits, clean_cache = model.run_with_cache(clean_tokens)
    corrupted_logits = model(corrupted_tokens)
    clean_logit_diff = logits_to_logit_diff(model, clean_logits)
    corrupted_logit_diff = logits_to_logit_diff(model, corrupted_logits)

    def residual_stream_patching_hook(resid_pre, hook, position):
        clean_resid_pre = clean_cache[hook.name]
        resid_pre[:, position, :] = clean_resid_pre[:, position, :]
        return resid_pre

    num_positions = len(clean_tokens[0])
    ioi_patching_result = torch.zeros((model.cfg.n_layers, num_positions), device=model.cfg.device)
    for layer in range(model.cfg.n_layers):
        for position in range(num_positions):
            temp_hook_fn = partial(residual_stream_patching_hook, position=position)
            patched_logits = model.run_with_hooks(
                corrupted_tokens, fwd_hooks=[(utils.get_act_name("resid_pre", layer), temp_hook_fn)]
            )
            patched_logit_diff = logits_to_logit_diff(model, patched_logits).detach()
            ioi_patching_result[layer, position] = (patched_logit_diff - corrupted_logit_diff) / (
                clean_logit_diff - corrupted_logit_diff
            )
    (differs,) = (clean_tokens != corrupted_tokens)[0].nonzero()[:, 0].tolist()
    expected_layer0 = torch.zeros(num_positions)
    expected_layer0[differs] = 1.0  # patching the one differing position restores the clean run
    torch.testing.assert_close(ioi_patching_result[0], expected_layer0, rtol=0, atol=1e-5)

    def metric(logits):
        return (logits_to_logit_diff(model, logits) - corrupted_logit_diff) / (clean_logit_diff - corrupted_logit_diff)

    grid = lens.patching.get_act_patch_resid_pre(model, corrupted_tokens, clean_cache, metric)
    # 1e-5 in the logit difference: the metric divides it by the clean - corrupted gap (small in a random model)
    atol = 1e-5 / abs(clean_logit_diff - corrupted_logit_diff).item()
    torch.testing.assert_close(grid, ioi_patching_result, rtol=0, atol=atol)


def test_factored_matrix_and_ov_circuits(model, lens):
    FactoredMatrix = lens.FactoredMatrix
    g = torch.Generator().manual_seed(0)
    A, B = torch.randn(5, 2, generator=g), torch.randn(2, 5, generator=g)
    AB = A @ B
    AB_factor = FactoredMatrix(A, B)
    torch.testing.assert_close(AB_factor.norm(), AB.norm())
    assert (AB_factor.ldim, AB_factor.rdim, AB_factor.mdim) == (5, 5, 2)
    full_eig = torch.linalg.eig(AB).eigenvalues
    for value in AB_factor.eigenvalues:  # the non-zero eigenvalues, from the 2 x 2 inner product
        assert (full_eig - value).abs().min() < 1e-4
    torch.testing.assert_close(AB_factor.S, torch.linalg.svd(AB).S[:2])
    U, S, V = AB_factor.svd()  # TransformerLens's third factor is V (its `Vh` is a deprecated name for it)
    torch.testing.assert_close(U @ torch.diag(S) @ V.T, AB, rtol=1e-4, atol=1e-4)
    C = torch.randn(5, 300, generator=g)
    ABC, ABC_factor = AB @ C, AB_factor @ C
    assert ABC_factor.shape == ABC.shape == (5, 300)
    torch.testing.assert_close(ABC_factor.norm(), ABC.norm(), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(AB_factor.AB, AB)

    OV_circuit_all_heads = model.OV  # [layer, head, d_model, d_model], factored
    OV_circuit_all_heads_eigenvalues = OV_circuit_all_heads.eigenvalues  # [layer, head, d_head]
    OV_copying_score = OV_circuit_all_heads_eigenvalues.sum(dim=-1).real / OV_circuit_all_heads_eigenvalues.abs().sum(
        dim=-1
    )
    assert OV_copying_score.shape == (model.cfg.n_layers, model.cfg.n_heads) and (OV_copying_score.abs() <= 1).all()
    torch.testing.assert_close(OV_circuit_all_heads[1, 2].AB, model.W_V[1, 2] @ model.W_O[1, 2])
    full_OV_circuit = model.embed.W_E @ OV_circuit_all_heads @ model.unembed.W_U  # [layer, head, vocab, vocab]
    assert full_OV_circuit.shape == (model.cfg.n_layers, model.cfg.n_heads, model.cfg.d_vocab, model.cfg.d_vocab)
    dense = model.W_E @ model.W_V[0, 1] @ model.W_O[0, 1] @ model.W_U
    torch.testing.assert_close(full_OV_circuit[0, 1].AB, dense, rtol=1e-4, atol=1e-4)
    QK = model.QK[0, 1]  # queries and keys: W_Q W_K^T
    torch.testing.assert_close(QK.AB, model.W_Q[0, 1] @ model.W_K[0, 1].T)


def test_generate(model):
    output = model.generate("The quick brown fox", max_new_tokens=8, temperature=0.7, prepend_bos=True, verbose=False)
    assert isinstance(output, str) and output.startswith("The quick brown fox")
    tokens = model.generate(model.to_tokens("The quick brown fox"), max_new_tokens=5, do_sample=False, verbose=False)
    logits = model(tokens[:, :-1])  # greedy: each new token is the argmax of the full (uncached) forward
    n_prompt = model.to_tokens("The quick brown fox").shape[1]
    assert torch.equal(logits[:, n_prompt - 1 :].argmax(-1), tokens[:, n_prompt:])


def test_hook_points_on_a_model_of_ones_own(lens):
    HookPoint, HookedRootModule = lens.HookPoint, lens.HookedRootModule

    class SquareThenAdd(nn.Module):
        def __init__(self, offset):
            super().__init__()
            self.offset = nn.Parameter(torch.tensor(offset))
            self.hook_square = HookPoint()

        def forward(self, x):
            square = self.hook_square(x * x)  # [batch, ...]
            return self.offset + square

    class TwoLayerModel(HookedRootModule):
        def __init__(self):
            super().__init__()
            self.layer1 = SquareThenAdd(3.0)
            self.layer2 = SquareThenAdd(-4.0)
            self.hook_in = HookPoint()
            self.hook_mid = HookPoint()
            self.hook_out = HookPoint()
            self.setup()

        def forward(self, x):
            x_in = self.hook_in(x)
            x_mid = self.hook_mid(self.layer1(x_in))
            x_out = self.hook_out(self.layer2(x_mid))
            return x_out

    model = TwoLayerModel()
    out, cache = model.run_with_cache(torch.tensor(5.0))
    assert out.item() == (5.0**2 + 3.0) ** 2 - 4.0
    assert {key: cache[key].item() for key in cache} == {
        "hook_in": 5.0, "layer1.hook_square": 25.0, "hook_mid": 28.0, "layer2.hook_square": 784.0, "hook_out": 780.0,
    }  # fmt: skip

    def set_to_zero_hook(tensor, hook):
        return 0.0 * tensor

    intervened = model.run_with_hooks(torch.tensor(5.0), fwd_hooks=[("layer2.hook_square", set_to_zero_hook)])
    assert intervened.item() == -4.0


def test_exploratory_logit_lens_and_head_patching(model, lens):
    utils = lens.utils
    answer_tokens = torch.tensor([[model.to_single_token(" John"), model.to_single_token(" Mary")]])
    tokens, corrupted_tokens = model.to_tokens(CLEAN_PROMPT), model.to_tokens(CORRUPTED_PROMPT)
    original_logits, cache = model.run_with_cache(tokens)

    # the logit lens: apply_ln=True normalises each layer's stream as ln_final would (its own statistics)
    accumulated_residual, labels = cache.accumulated_resid(
        layer=-1, incl_mid=True, pos_slice=-1, apply_ln=True, return_labels=True
    )  # [component, batch, d_model]
    lens_logits = accumulated_residual @ model.W_U + model.b_U  # [component, batch, d_vocab]
    torch.testing.assert_close(lens_logits[-1], original_logits[:, -1], rtol=1e-5, atol=1e-4)
    raw = cache.accumulated_resid(layer=-1, incl_mid=True, pos_slice=-1)
    for component, label in zip(range(len(labels)), labels, strict=True):
        torch.testing.assert_close(accumulated_residual[component], model.ln_final(raw[component]), msg=label)
    attrs = cache.logit_attrs(accumulated_residual, answer_tokens[:, 0], answer_tokens[:, 1], pos_slice=-1)
    logit_diff = original_logits[0, -1, answer_tokens[0, 0]] - original_logits[0, -1, answer_tokens[0, 1]]
    torch.testing.assert_close(attrs[-1, 0], logit_diff, rtol=1e-5, atol=1e-4)  # (b_U is zero here)

    corrupted_logits, corrupted_cache = model.run_with_cache(corrupted_tokens, return_type="logits")

    def logits_to_ave_logit_diff(logits, answer_tokens):
        final_logits = logits[:, -1, :]
        answer_logits = final_logits.gather(dim=-1, index=answer_tokens)
        return (answer_logits[:, 0] - answer_logits[:, 1]).mean()

    original_average_logit_diff = logits_to_ave_logit_diff(original_logits, answer_tokens)
    corrupted_average_logit_diff = logits_to_ave_logit_diff(corrupted_logits, answer_tokens)

    def normalize_patched_logit_diff(patched_logit_diff):
        return (patched_logit_diff - corrupted_average_logit_diff) / (
            original_average_logit_diff - corrupted_average_logit_diff
        )

    def patch_head_vector(corrupted_head_vector, hook, head_index, clean_cache):
        corrupted_head_vector[:, :, head_index, :] = clean_cache[hook.name][:, :, head_index, :]
        return corrupted_head_vector

    def patch_head_pattern(corrupted_head_pattern, hook, head_index, clean_cache):
        corrupted_head_pattern[:, head_index, :, :] = clean_cache[hook.name][:, head_index, :, :]
        return corrupted_head_pattern

    patched_head_z_diff = torch.zeros(model.cfg.n_layers, model.cfg.n_heads, device=model.cfg.device)
    patched_head_attn_diff = torch.zeros(model.cfg.n_layers, model.cfg.n_heads, device=model.cfg.device)
    for layer, head_index in itertools.product(range(model.cfg.n_layers), range(model.cfg.n_heads)):
        for store, patch, name in (
            (patched_head_z_diff, patch_head_vector, utils.get_act_name("z", layer, "attn")),
            (patched_head_attn_diff, patch_head_pattern, utils.get_act_name("attn", layer, "attn")),
        ):
            hook_fn = partial(patch, head_index=head_index, clean_cache=cache)
            patched_logits = model.run_with_hooks(corrupted_tokens, fwd_hooks=[(name, hook_fn)], return_type="logits")
            patched_logit_diff = logits_to_ave_logit_diff(patched_logits, answer_tokens)
            store[layer, head_index] = normalize_patched_logit_diff(patched_logit_diff)

    def metric(logits):
        return normalize_patched_logit_diff(logits_to_ave_logit_diff(logits, answer_tokens))

    patching = lens.patching
    z_grid = patching.get_act_patch_attn_head_out_all_pos(model, corrupted_tokens, cache, metric)
    pattern_grid = patching.get_act_patch_attn_head_pattern_all_pos(model, corrupted_tokens, cache, metric)
    # 1e-5 in the logit difference: the normalised metric divides it by the clean - corrupted gap
    atol = 1e-5 / abs(original_average_logit_diff - corrupted_average_logit_diff).item()
    torch.testing.assert_close(z_grid, patched_head_z_diff, rtol=0, atol=atol)
    torch.testing.assert_close(pattern_grid, patched_head_attn_diff, rtol=0, atol=atol)
    assert not torch.equal(patched_head_z_diff, torch.zeros_like(patched_head_z_diff))
