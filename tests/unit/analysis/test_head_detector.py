"""Head detector: pattern builders and scores on hand-made attention patterns
(docs/analysis-and-patching.md#head-detector-and-test_prompt)."""

import pytest
import torch

from hooked import HookedTransformer, HookedTransformerConfig
from hooked.analysis.head_detector import (
    detect_head,
    get_duplicate_token_head_detection_pattern,
    get_induction_head_detection_pattern,
    get_previous_token_head_detection_pattern,
    get_supported_heads,
)

torch.set_num_threads(1)

PROMPT = "The quick brown fox jumps over the lazy dog."


@pytest.fixture(scope="module")
def model(tokenizer):
    cfg = HookedTransformerConfig(
        d_model=32, d_head=8, n_layers=2, n_ctx=64, d_vocab=len(tokenizer), act_fn="relu", seed=0
    )
    return HookedTransformer(cfg, tokenizer=tokenizer)


def test_builders():
    tokens = torch.tensor([[5, 6, 7, 5, 6]])
    prev = get_previous_token_head_detection_pattern(tokens)
    assert prev.shape == (5, 5) and prev.sum() == 4 and all(prev[i, i - 1] == 1 for i in range(1, 5))
    dup = get_duplicate_token_head_detection_pattern(tokens)
    assert dup.nonzero().tolist() == [[3, 0], [4, 1]]
    ind = get_induction_head_detection_pattern(tokens)
    assert ind.nonzero().tolist() == [[3, 1], [4, 2]]
    assert get_supported_heads() == ["previous_token_head", "duplicate_token_head", "induction_head"]


def test_exact_previous_token_pattern_scores_one(model):
    tokens = model.to_tokens(PROMPT)
    p = tokens.shape[-1]
    _, cache = model.run_with_cache(tokens, remove_batch_dim=True)
    exact = get_previous_token_head_detection_pattern(tokens)
    exact[0, 0] = 1  # the first token can only attend to itself
    cache.cache_dict["blocks.1.attn.hook_pattern"][2] = exact
    before = cache["pattern", 1].clone()
    scores = detect_head(model, PROMPT, "previous_token_head", cache=cache, exclude_current_token=True)
    assert scores.shape == (2, 4)
    assert scores[1, 2].item() == pytest.approx(1.0, abs=1e-6)
    assert torch.equal(cache["pattern", 1], before)  # exclusions work on a copy
    mul = detect_head(model, PROMPT, "previous_token_head", cache=cache)
    assert mul[1, 2].item() == pytest.approx((p - 1) / p, abs=1e-6)  # row 0's self-attention is off-pattern
    absolute = detect_head(model, PROMPT, exact, cache=cache, error_measure="abs")
    assert absolute[1, 2].item() == 1.0
    # Uniform causal attention puts 1/(i+1) of row i on the previous token.
    uniform = torch.tril(torch.ones(p, p)) / torch.arange(1, p + 1)[:, None]
    cache.cache_dict["blocks.0.attn.hook_pattern"][0] = uniform
    score = detect_head(model, PROMPT, "previous_token_head", heads=[(0, 0)], cache=cache)
    assert score[0, 0].item() == pytest.approx(sum(1 / (i + 1) for i in range(1, p)) / p, abs=1e-6)
    assert (score.flatten()[1:] == -1).all()  # heads not asked for


@pytest.mark.unchecked  # a wrongly typed argument on purpose: the library's own error, which the checks would preempt
def test_heads_dict_prompt_list_and_validation(model):
    scores = detect_head(model, PROMPT, "induction_head", heads={1: [0, 3]})
    assert (scores[0] == -1).all() and scores[1, 1] == -1 and scores[1, 0] >= 0
    prompts = [PROMPT, "The capital of France is Paris."]
    mean = detect_head(model, prompts, "duplicate_token_head")
    singles = [detect_head(model, s, "duplicate_token_head") for s in prompts]
    torch.testing.assert_close(mean, torch.stack(singles).mean(0))
    p = model.to_tokens(PROMPT).shape[-1]
    with pytest.raises(ValueError, match="lower triangular"):
        detect_head(model, PROMPT, torch.ones(p, p))
    with pytest.raises(ValueError, match="must be"):
        detect_head(model, PROMPT, torch.zeros(p + 1, p + 1))
    with pytest.raises(ValueError, match="Unknown head type"):
        detect_head(model, PROMPT, "copy_head")
    with pytest.raises(ValueError, match="single prompt"):
        detect_head(model, prompts, "induction_head", cache=object())


# -- token tensors (ARENA's repeated random tokens) ---------------------------------------------
def test_token_tensor_equals_the_text_path_when_the_text_round_trips(model):
    tokens = model.to_tokens(PROMPT)  # [1, pos]
    assert torch.equal(model.to_tokens(model.to_string(tokens[0])), tokens)  # this text round-trips
    for pattern in ("previous_token_head", "duplicate_token_head", "induction_head"):
        from_text = detect_head(model, PROMPT, pattern)
        torch.testing.assert_close(detect_head(model, tokens, pattern), from_text, atol=0, rtol=0)
        torch.testing.assert_close(detect_head(model, tokens[0], pattern), from_text, atol=0, rtol=0)


def test_repeated_random_tokens_batch_averages_the_rows(model):
    gen = torch.Generator().manual_seed(0)
    half = torch.randint(3, model.cfg.d_vocab, (3, 6), generator=gen)
    rep_tokens = torch.cat([half, half], dim=1)  # [batch, 2 * 6]
    scores = detect_head(model, rep_tokens, "induction_head")
    rows = torch.stack([detect_head(model, row, "induction_head") for row in rep_tokens])
    torch.testing.assert_close(scores, rows.mean(0), atol=1e-6, rtol=0)
    _, cache = model.run_with_cache(rep_tokens[:1])
    torch.testing.assert_close(
        detect_head(model, rep_tokens[:1], "induction_head", cache=cache), rows[0], atol=0, rtol=0
    )


@pytest.mark.unchecked  # a wrongly typed argument on purpose: the library's own error, which the checks would preempt
def test_a_cache_of_another_input_is_refused(model):
    from hooked.core.errors import InputError

    tokens = model.to_tokens(PROMPT)
    _, other = model.run_with_cache(model.to_tokens("Hooks let you read"))
    with pytest.raises(InputError, match="the cache was made from other tokens"):
        detect_head(model, tokens, "previous_token_head", cache=other)
    with pytest.raises(InputError, match="integer tensor"):
        detect_head(model, tokens.float(), "previous_token_head")
    with pytest.raises(InputError, match=r"token ids must lie in \[0, "):
        detect_head(model, tokens + model.cfg.d_vocab, "previous_token_head")
