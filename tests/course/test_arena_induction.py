"""ARENA chapter 1.2 (induction heads), as the exercises write it, on a two-layer attention-only model.

The chapter loads a trained attention-only model (`HookedTransformerConfig(..., attn_only=True,
normalization_type=None, positional_embedding_type="shortformer", use_attn_result=True)` and
`model.load_state_dict(...)`). Here the same config, at d_model 112, loads weights planted by hand so that the
heads the chapter looks for exist: in layer 0 a current-token head (0.0), a previous-token head (0.1) writing
the previous token into its own subspace, a first-token head (0.2); in layer 1 an induction head (1.0) whose
keys read that subspace (K-composition) and whose values copy the attended token to the output. Everything
else is small noise. So each exercise has a known answer: the detectors find these heads, the induction
score hook agrees with the cache, ablating them raises the loss on repeated tokens, the logit attribution
sums to the logits, the OV circuit of 1.0 copies, and the q/k decomposition sums to the cached q and k.
"""

from __future__ import annotations

import functools
import itertools

import einops
import pytest
import torch as t

D_POS, D_TOK, D_PREV = slice(0, 16), slice(16, 64), slice(64, 112)  # residual subspaces of the planted model


def attn_only_config(lens, d_vocab):
    """The chapter's config, smaller (the tokenizer is given to the model, not named)."""
    return lens.HookedTransformerConfig(
        d_model=112, d_head=48, n_heads=4, n_layers=2, n_ctx=16, d_vocab=d_vocab, attention_dir="causal",
        attn_only=True, tokenizer_name=None, seed=398, use_attn_result=True, normalization_type=None,
        positional_embedding_type="shortformer",
    )  # fmt: skip


def planted_weights(state_dict: dict[str, t.Tensor]) -> dict[str, t.Tensor]:
    """The shapes of `state_dict`, filled with the circuit described in the module docstring."""
    g = t.Generator().manual_seed(0)
    sd = {name: t.randn(p.shape, generator=g) * 0.01 for name, p in state_dict.items()}  # noise everywhere
    for name in sd:
        if name.endswith(("b_Q", "b_K", "b_V", "b_O", "b_U")):
            sd[name].zero_()
    eye = t.eye(48)
    sd["embed.W_E"][:, D_TOK] = t.randn(sd["embed.W_E"].shape[0], 48, generator=g)  # tokens: random directions
    sd["embed.W_E"][:, D_POS] = sd["embed.W_E"][:, D_PREV] = 0
    sd["pos_embed.W_pos"].zero_()
    sd["pos_embed.W_pos"][:, D_POS] = 8 * t.eye(16)  # position p: 8 e_p (feeds queries and keys only)
    read_pos = t.zeros(112, 48)
    read_pos[D_POS, :16] = t.eye(16)  # [d_model, d_head]: the position into head dims 0..15
    shift = t.zeros(48, 48)
    shift[t.arange(15), t.arange(1, 16)] = 1  # e_p -> e_{p+1}
    W_Q, W_K, W_V, W_O = (sd[f"blocks.0.attn.{w}"] for w in ("W_Q", "W_K", "W_V", "W_O"))
    W_Q[0], W_K[0] = read_pos, read_pos  # 0.0: q_i . k_j = 64 [i == j]
    W_Q[1], W_K[1] = read_pos, read_pos @ shift  # 0.1: 64 [j == i - 1]
    W_Q[2], W_K[2] = 0, read_pos  # 0.2: q = b_Q = 8 e_0, so 64 [j == 0]
    sd["blocks.0.attn.b_Q"][2, 0] = 8
    W_V[1] = 0
    W_V[1][D_TOK] = eye  # 0.1 copies the previous token ...
    W_O[1] = 0
    W_O[1][:, D_PREV] = eye  # ... into its own subspace
    W_Q, W_K, W_V, W_O = (sd[f"blocks.1.attn.{w}"] for w in ("W_Q", "W_K", "W_V", "W_O"))
    W_Q[0], W_K[0], W_V[0], W_O[0] = 0, 0, 0, 0
    W_Q[0][D_TOK] = 3 * eye  # 1.0: the current token ...
    W_K[0][D_PREV] = eye  # ... against each position's previous token (K-composition with 0.1)
    W_V[0][D_TOK] = eye
    W_O[0][:, D_TOK] = 2 * eye  # and writes the attended token, twice as strong as the direct path
    sd["unembed.W_U"].zero_()
    sd["unembed.W_U"][D_TOK] = sd["embed.W_E"][:, D_TOK].T  # logits: each token's dot product with the stream
    return sd


@pytest.fixture
def model(lens, course_tokenizer, tmp_path):
    cfg = attn_only_config(lens, len(course_tokenizer))
    model = lens.HookedTransformer(cfg)
    model.set_tokenizer(course_tokenizer)
    weights_path = tmp_path / "attn_only_2L_half.pth"
    t.save(planted_weights(model.state_dict()), weights_path)
    pretrained_weights = t.load(weights_path, map_location="cpu", weights_only=True)
    model.load_state_dict(pretrained_weights)
    return model


# -- the chapter's functions, as the exercises write them ---------------------------------------------------
def current_attn_detector(model, cache) -> list[str]:
    attn_heads = []
    for layer in range(model.cfg.n_layers):
        for head in range(model.cfg.n_heads):
            attention_pattern = cache["pattern", layer][head]
            score = attention_pattern.diagonal().mean()
            if score > 0.4:
                attn_heads.append(f"{layer}.{head}")
    return attn_heads


def prev_attn_detector(model, cache) -> list[str]:
    attn_heads = []
    for layer in range(model.cfg.n_layers):
        for head in range(model.cfg.n_heads):
            attention_pattern = cache["pattern", layer][head]
            score = attention_pattern.diagonal(-1).mean()
            if score > 0.4:
                attn_heads.append(f"{layer}.{head}")
    return attn_heads


def first_attn_detector(model, cache) -> list[str]:
    attn_heads = []
    for layer in range(model.cfg.n_layers):
        for head in range(model.cfg.n_heads):
            attention_pattern = cache["pattern", layer][head]
            score = attention_pattern[:, 0].mean()
            if score > 0.4:
                attn_heads.append(f"{layer}.{head}")
    return attn_heads


def induction_attn_detector(model, cache, seq_len) -> list[str]:
    attn_heads = []
    for layer in range(model.cfg.n_layers):
        for head in range(model.cfg.n_heads):
            attention_pattern = cache["pattern", layer][head]
            score = attention_pattern.diagonal(-seq_len + 1).mean()
            if score > 0.4:
                attn_heads.append(f"{layer}.{head}")
    return attn_heads


def generate_repeated_tokens(model, seq_len, batch=1):
    t.manual_seed(0)
    prefix = (t.ones(batch, 1) * model.tokenizer.bos_token_id).long()
    rep_tokens_half = t.randint(0, model.cfg.d_vocab, (batch, seq_len), dtype=t.int64)
    return t.cat([prefix, rep_tokens_half, rep_tokens_half], dim=-1)


def get_log_probs(logits, tokens):
    logprobs = logits.log_softmax(dim=-1)
    return logprobs[:, :-1].gather(dim=-1, index=tokens[:, 1:].unsqueeze(-1)).squeeze(-1)


SEQ_LEN = 7  # 1 + 2 * 7 = 15 positions (n_ctx 16)


def test_detectors_find_the_heads_and_the_cache_matches_q_and_k(model):
    text = "The quick brown fox jumps over the lazy dog."
    str_tokens = model.to_str_tokens(text)
    logits, cache = model.run_with_cache(text, remove_batch_dim=True)
    assert len(str_tokens) == logits.shape[1] == cache["pattern", 0].shape[-1]
    assert current_attn_detector(model, cache) == ["0.0"]
    assert prev_attn_detector(model, cache) == ["0.1"]
    assert first_attn_detector(model, cache) == ["0.2"]

    # the chapter's check of the cache: layer 0's pattern from q and k (a shortformer adds positions to both)
    layer0_pattern_from_cache = cache["pattern", 0]
    q, k = cache["q", 0], cache["k", 0]
    seq, nhead, headsize = q.shape
    layer0_attn_scores = einops.einsum(q, k, "seqQ n h, seqK n h -> n seqQ seqK")
    mask = t.triu(t.ones((seq, seq), dtype=t.bool), diagonal=1)
    layer0_attn_scores.masked_fill_(mask, -1e9)
    layer0_pattern_from_q_and_k = (layer0_attn_scores / headsize**0.5).softmax(-1)
    t.testing.assert_close(layer0_pattern_from_cache, layer0_pattern_from_q_and_k)


def test_induction_on_repeated_tokens_and_the_hook_score(model, lens):
    rep_tokens = generate_repeated_tokens(model, SEQ_LEN)
    rep_logits, rep_cache = model.run_with_cache(rep_tokens)
    rep_cache.remove_batch_dim()
    log_probs = get_log_probs(rep_logits, rep_tokens).squeeze()
    assert log_probs[SEQ_LEN:].mean() > log_probs[: SEQ_LEN - 1].mean() + 5  # the repeated half is predicted
    assert induction_attn_detector(model, rep_cache, SEQ_LEN) == ["1.0"]

    seq_len = SEQ_LEN
    rep_tokens_10 = generate_repeated_tokens(model, seq_len, batch=10)
    induction_score_store = t.zeros((model.cfg.n_layers, model.cfg.n_heads), device=model.cfg.device)

    def induction_score_hook(pattern, hook):
        induction_stripe = pattern.diagonal(dim1=-2, dim2=-1, offset=1 - seq_len)
        induction_score = einops.reduce(induction_stripe, "batch head_index position -> head_index", "mean")
        induction_score_store[hook.layer(), :] = induction_score

    pattern_hook_names_filter = lambda name: name.endswith("pattern")  # noqa: E731  (as the chapter writes it)
    model.run_with_hooks(rep_tokens_10, return_type=None, fwd_hooks=[(pattern_hook_names_filter, induction_score_hook)])
    _, cache_10 = model.run_with_cache(rep_tokens_10)
    for layer in range(model.cfg.n_layers):  # the hook saw what the cache holds
        stripe = cache_10["pattern", layer].diagonal(dim1=-2, dim2=-1, offset=1 - seq_len).mean((0, -1))
        t.testing.assert_close(induction_score_store[layer], stripe)
    assert induction_score_store.argmax() == 4 and induction_score_store[1, 0] > 0.7  # head 1.0
    assert (induction_score_store.flatten()[:4] < 0.4).all()
    assert not any(hp.has_hooks() for hp in model.hook_points())
    # the same hook by its full name, from utils.get_act_name
    name = lens.utils.get_act_name("pattern", 1)
    assert name == "blocks.1.attn.hook_pattern"
    model.run_with_hooks(rep_tokens_10, return_type=None, fwd_hooks=[(name, induction_score_hook)])
    stripe = cache_10["pattern", 1].diagonal(offset=1 - seq_len, dim1=-2, dim2=-1).mean((0, -1))
    t.testing.assert_close(induction_score_store[1], stripe)


def logit_attribution(embed, l1_results, l2_results, W_U, tokens):
    W_U_correct_tokens = W_U[:, tokens[1:]]
    direct_attributions = einops.einsum(W_U_correct_tokens, embed[:-1], "emb seq, seq emb -> seq")
    l1_attributions = einops.einsum(W_U_correct_tokens, l1_results[:-1], "emb seq, seq nhead emb -> seq nhead")
    l2_attributions = einops.einsum(W_U_correct_tokens, l2_results[:-1], "emb seq, seq nhead emb -> seq nhead")
    return t.concat([direct_attributions.unsqueeze(-1), l1_attributions, l2_attributions], dim=-1)


def test_logit_attribution_sums_to_the_correct_token_logits(model):
    rep_tokens = generate_repeated_tokens(model, SEQ_LEN)
    logits, cache = model.run_with_cache(rep_tokens, remove_batch_dim=True)
    tokens = rep_tokens
    with t.inference_mode():
        embed = cache["embed"]
        l1_results = cache["result", 0]
        l2_results = cache["result", 1]
        logit_attr = logit_attribution(embed, l1_results, l2_results, model.W_U, tokens[0])
        correct_token_logits = logits[0, t.arange(len(tokens[0]) - 1), tokens[0, 1:]]
        # biases are zero here, so the attributions are the whole logit (the chapter allows 1e-3 for its biases)
        t.testing.assert_close(logit_attr.sum(1), correct_token_logits, atol=1e-4, rtol=1e-5)
    # predicting the repeated half (positions 8.. predict tokens 9..), the induction head (column 1 + n_heads)
    # is the largest contribution
    second_half = logit_attr[SEQ_LEN + 1 :]
    assert (second_half.argmax(-1) == 1 + model.cfg.n_heads).all()


def head_zero_ablation_hook(z, hook, head_index_to_ablate):
    z[:, :, head_index_to_ablate, :] = 0.0


def head_mean_ablation_hook(z, hook, head_index_to_ablate):
    z[:, :, head_index_to_ablate, :] = z[:, :, head_index_to_ablate, :].mean(0)


def get_ablation_scores(model, tokens, utils, ablation_function=head_zero_ablation_hook):
    ablation_scores = t.zeros((model.cfg.n_layers, model.cfg.n_heads), device=model.cfg.device)
    model.reset_hooks()
    seq_len = (tokens.shape[1] - 1) // 2
    logits = model(tokens, return_type="logits")
    loss_no_ablation = -get_log_probs(logits, tokens)[:, -(seq_len - 1) :].mean()
    for layer in range(model.cfg.n_layers):
        for head in range(model.cfg.n_heads):
            temp_hook_fn = functools.partial(ablation_function, head_index_to_ablate=head)
            ablated_logits = model.run_with_hooks(tokens, fwd_hooks=[(utils.get_act_name("z", layer), temp_hook_fn)])
            loss = -get_log_probs(ablated_logits, tokens)[:, -(seq_len - 1) :].mean()
            ablation_scores[layer, head] = loss - loss_no_ablation
    return ablation_scores


def test_head_ablation_hooks(model, lens):
    rep_tokens = generate_repeated_tokens(model, SEQ_LEN, batch=4)
    ablation_scores = get_ablation_scores(model, rep_tokens, lens.utils)
    top_two = set(ablation_scores.flatten().topk(2).indices.tolist())
    assert top_two == {1, 4}  # the previous-token head 0.1 and the induction head 1.0
    assert (ablation_scores.flatten()[[0, 2, 3, 5, 6, 7]].abs() < 0.5 * ablation_scores.flatten()[[1, 4]].min()).all()
    # a layer-1 head writes straight to the logits: zero-ablating it removes exactly its result through W_U
    logits, cache = model.run_with_cache(rep_tokens)
    for ablate, replacement in ((head_zero_ablation_hook, 0.0), (head_mean_ablation_hook, None)):
        hook_fn = functools.partial(ablate, head_index_to_ablate=0)
        ablated = model.run_with_hooks(rep_tokens, fwd_hooks=[(lens.utils.get_act_name("z", 1), hook_fn)])
        result = cache["result", 1][:, :, 0]  # [batch, pos, d_model]
        new_result = t.zeros_like(result) if replacement == 0.0 else result.mean(0, keepdim=True).expand_as(result)
        t.testing.assert_close(ablated, logits + (new_result - result) @ model.W_U, rtol=1e-5, atol=1e-4)


def top_1_acc(full_OV_circuit, batch_size=1000):
    total = 0
    for indices in t.split(t.arange(full_OV_circuit.shape[0]), batch_size):
        AB_slice = full_OV_circuit[indices]
        total += (t.argmax(AB_slice.AB, dim=1) == indices).float().sum().item()
    return total / full_OV_circuit.shape[0]


def test_ov_and_qk_circuits_with_factored_matrix(model, lens):
    FactoredMatrix = lens.FactoredMatrix
    layer, head_index = 1, 0
    W_O = model.W_O[layer, head_index]
    W_V = model.W_V[layer, head_index]
    W_E = model.W_E
    W_U = model.W_U
    OV_circuit = FactoredMatrix(W_V, W_O)
    full_OV_circuit = W_E @ OV_circuit @ W_U
    assert full_OV_circuit.shape == (model.cfg.d_vocab, model.cfg.d_vocab)
    t.testing.assert_close(full_OV_circuit.AB, W_E @ W_V @ W_O @ W_U, rtol=1e-5, atol=1e-3)
    dense_acc = (full_OV_circuit.AB.argmax(1) == t.arange(model.cfg.d_vocab)).float().mean().item()
    assert top_1_acc(full_OV_circuit, batch_size=128) == dense_acc > 0.95  # the induction head copies
    t.testing.assert_close((W_E @ model.OV[layer, head_index] @ W_U).AB, full_OV_circuit.AB, rtol=1e-5, atol=1e-3)

    # the previous-token head's positional attention, from the weights alone
    layer, head_index = 0, 1
    W_pos = model.W_pos
    W_QK = model.W_Q[layer, head_index] @ model.W_K[layer, head_index].T
    pos_by_pos_scores = W_pos @ W_QK @ W_pos.T
    mask = t.tril(t.ones_like(pos_by_pos_scores)).bool()
    masked_scaled = t.where(mask, pos_by_pos_scores / model.cfg.d_head**0.5, -1.0e6)
    pos_by_pos_pattern = t.softmax(masked_scaled, dim=-1)
    assert pos_by_pos_pattern.diag(-1).mean() > 0.99  # attends to the previous position
    t.testing.assert_close((W_pos @ model.QK[layer, head_index] @ W_pos.T).AB, pos_by_pos_scores, rtol=1e-5, atol=1e-3)
    _, cache = model.run_with_cache(generate_repeated_tokens(model, SEQ_LEN), remove_batch_dim=True)
    n = cache["pattern", 0].shape[-1]  # its queries and keys read positions only: the cached pattern is this
    t.testing.assert_close(cache["pattern", 0][head_index], pos_by_pos_pattern[:n, :n], rtol=1e-5, atol=1e-5)


def test_k_composition_decomposition_and_scores(model):
    rep_tokens = generate_repeated_tokens(model, SEQ_LEN)
    _, rep_cache = model.run_with_cache(rep_tokens)
    rep_cache.remove_batch_dim()
    ind_head_index = 0

    def decompose_qk_input(cache):
        y0 = cache["embed"].unsqueeze(0)  # [1 seq d_model]
        y1 = cache["pos_embed"].unsqueeze(0)  # [1 seq d_model]
        y_rest = cache["result", 0].transpose(0, 1)  # [heads seq d_model]
        return t.concat([y0, y1, y_rest], dim=0)

    def decompose_q(decomposed_qk_input, ind_head_index):
        W_Q = model.W_Q[1, ind_head_index]
        return einops.einsum(decomposed_qk_input, W_Q, "n seq d_model, d_model d_head -> n seq d_head")

    def decompose_k(decomposed_qk_input, ind_head_index):
        W_K = model.W_K[1, ind_head_index]
        return einops.einsum(decomposed_qk_input, W_K, "n seq d_model, d_model d_head -> n seq d_head")

    decomposed_qk_input = decompose_qk_input(rep_cache)
    decomposed_q = decompose_q(decomposed_qk_input, ind_head_index)
    decomposed_k = decompose_k(decomposed_qk_input, ind_head_index)
    # a shortformer: the residual stream holds no positions, queries and keys read them on top
    t.testing.assert_close(decomposed_qk_input.sum(0), rep_cache["resid_pre", 1] + rep_cache["pos_embed"])
    t.testing.assert_close(decomposed_q.sum(0), rep_cache["q", 1][:, ind_head_index], rtol=1e-5, atol=1e-4)
    t.testing.assert_close(decomposed_k.sum(0), rep_cache["k", 1][:, ind_head_index], rtol=1e-5, atol=1e-4)

    decomposed_scores = einops.einsum(
        decomposed_q, decomposed_k, "q_comp q_pos d_head, k_comp k_pos d_head -> q_comp k_comp q_pos k_pos"
    )
    component_stds = einops.reduce(decomposed_scores, "q_comp k_comp q_pos k_pos -> q_comp k_comp", t.std)
    assert divmod(component_stds.argmax().item(), component_stds.shape[1]) == (0, 3)  # q: embed; k: head 0.1

    def get_comp_score(W_A, W_B):
        W_A_norm = W_A.pow(2).sum().sqrt()
        W_B_norm = W_B.pow(2).sum().sqrt()
        W_AB_norm = (W_A @ W_B).pow(2).sum().sqrt()
        return (W_AB_norm / (W_A_norm * W_B_norm)).item()

    W_OV = [model.W_V[layer] @ model.W_O[layer] for layer in range(2)]  # [head, d_model, d_model]
    W_QK = [model.W_Q[layer] @ model.W_K[layer].transpose(-1, -2) for layer in range(2)]
    k_comp = t.tensor([[get_comp_score(W_OV[0][i], W_QK[1][j].T) for j in range(4)] for i in range(4)])
    assert divmod(k_comp.argmax().item(), 4) == (1, 0)  # 0.1 -> 1.0
    for i, j in itertools.product(range(4), range(4)):  # the same score from the factored circuits
        A, B = model.OV[0, i], model.QK[1, j].T
        score = ((A @ B).norm() / (A.norm() * B.norm())).item()
        t.testing.assert_close(score, k_comp[i, j].item(), rtol=1e-4, atol=1e-6)


@pytest.mark.slow
def test_induction_heads_of_a_real_model(smollm2_processed):
    """The chapter's induction experiments on a trained model (the bundled SmolLM2-135M, through `hooked`
    directly: the alias gives the same objects, and this is the one slow test): the repeated half of a random
    sequence is predicted, some heads score as induction heads, and ablating the best one hurts."""
    from hooked import utils

    model, seq_len = smollm2_processed, 16
    rep_tokens = generate_repeated_tokens(model, seq_len, batch=2)
    induction_score_store = t.zeros((model.cfg.n_layers, model.cfg.n_heads))

    def induction_score_hook(pattern, hook):
        induction_stripe = pattern.diagonal(dim1=-2, dim2=-1, offset=1 - seq_len)
        induction_score = einops.reduce(induction_stripe, "batch head_index position -> head_index", "mean")
        induction_score_store[hook.layer(), :] = induction_score

    pattern_hook_names_filter = lambda name: name.endswith("pattern")  # noqa: E731  (as the chapter writes it)
    rep_logits = model.run_with_hooks(rep_tokens, fwd_hooks=[(pattern_hook_names_filter, induction_score_hook)])
    log_probs = get_log_probs(rep_logits, rep_tokens)
    assert log_probs[:, seq_len:].mean() > log_probs[:, : seq_len - 1].mean() + 3  # the repeat is predicted
    best = divmod(induction_score_store.argmax().item(), model.cfg.n_heads)
    assert induction_score_store.max() > 0.5 and (induction_score_store > 0.3).sum() >= 3
    hook_fn = functools.partial(head_zero_ablation_hook, head_index_to_ablate=best[1])
    ablated = model.run_with_hooks(rep_tokens, fwd_hooks=[(utils.get_act_name("z", best[0]), hook_fn)])
    assert get_log_probs(ablated, rep_tokens)[:, seq_len:].mean() < log_probs[:, seq_len:].mean()
