"""Tokenizer helpers with real (trained) tokenizers: BOS at most once, per-call options, decoding."""

import copy

import pytest
import torch

from hooked import HookedTransformer, HookedTransformerConfig


def model_with(tokenizer, prepend_bos=True):
    cfg = HookedTransformerConfig(
        d_model=16,
        d_head=8,
        n_layers=1,
        n_ctx=64,
        act_fn="relu",
        d_vocab=len(tokenizer),
        default_prepend_bos=prepend_bos,
    )
    return HookedTransformer(cfg, tokenizer=tokenizer)


@pytest.mark.parametrize("fixture", ["tokenizer", "bos_tokenizer"])
def test_bos_added_at_most_once(request, fixture):
    tok = request.getfixturevalue(fixture)
    model = model_with(tok)
    bos = model.tokenizer.bos_token_id  # the model's copy: a tokenizer without BOS gets bos = eos there
    with_bos = model.to_tokens("The capital of France")
    without = model.to_tokens("The capital of France", prepend_bos=False)
    assert with_bos[0, 0] == bos and with_bos[0, 1] != bos
    assert without[0, 0] != bos and with_bos.shape[1] == without.shape[1] + 1
    torch.testing.assert_close(with_bos[:, 1:], without, atol=0, rtol=0)
    # a prompt that already starts with the BOS text does not get a second one
    literal = model.to_tokens(model.tokenizer.bos_token + "The capital")
    assert literal[0, 0] == bos and literal[0, 1] != bos


def test_per_call_options_leave_model_and_tokenizer_unchanged(tokenizer):
    model = model_with(tokenizer)
    before_cfg, before_side = copy.deepcopy(model.cfg.to_dict()), tokenizer.padding_side
    toks, mask = model.to_tokens(
        ["a b", "The quick brown fox"], prepend_bos=False, padding_side="left", return_attention_mask=True
    )
    assert mask[0, 0] == 0 and mask[0, -1] == 1 and toks[0, 0] == model.tokenizer.pad_token_id
    right = model.to_tokens(["a b", "The quick brown fox"], padding_side="right")
    assert right[0, 0] == model.tokenizer.bos_token_id and right[0, -1] == model.tokenizer.pad_token_id
    assert model.cfg.to_dict() == before_cfg and tokenizer.padding_side == before_side
    assert model.default_padding_side == "right"


def test_string_helpers(bos_tokenizer):
    model = model_with(bos_tokenizer)
    text = "The Eiffel Tower is in Paris"
    str_tokens = model.to_str_tokens(text)
    assert str_tokens[0] == "<s>" and "".join(str_tokens[1:]) == text
    assert model.to_str_tokens([text, "Paris"])[1][0] == "<s>"
    assert model.to_string(model.to_tokens(text, prepend_bos=False)[0]) == text
    assert model.to_string(model.to_tokens([text, text], prepend_bos=False)) == [text, text]
    paris = model.to_single_token(" Paris")
    assert model.to_single_str_token(paris) == " Paris"
    with pytest.raises(ValueError, match="not one"):
        model.to_single_token(" Eiffel Tower")
    assert model.get_token_position(" Paris", text) == len(str_tokens) - 1
    assert model.get_token_position(paris, model.to_tokens(text), mode="last") == len(str_tokens) - 1
    with pytest.raises(ValueError, match="does not occur"):
        model.get_token_position(" Paris", "The Eiffel")


def test_text_input_uses_the_tokenizer_mask(tokenizer):
    model = model_with(tokenizer)
    prompts = ["The quick brown fox jumps", "Paris"]
    batched = model(prompts, padding_side="left")
    for i, p in enumerate(prompts):
        alone = model(p)[0]
        torch.testing.assert_close(batched[i, -alone.shape[0] :], alone, atol=1e-5, rtol=0)
    right = model(prompts, padding_side="right")
    alone = model(prompts[1])[0]
    torch.testing.assert_close(right[1, : alone.shape[0]], alone, atol=1e-5, rtol=0)
    raw_left = model.to_tokens(prompts, padding_side="left")  # raw tokens: mask inferred for left padding
    torch.testing.assert_close(model(raw_left, padding_side="left"), batched, atol=1e-5, rtol=0)


# -- ids outside the vocabulary and too-short inputs give errors that name the value -----------


def test_to_str_tokens_rejects_an_id_past_the_vocabulary(tokenizer):
    model = model_with(tokenizer)
    n = model._vocab_size()
    assert model.to_str_tokens(torch.tensor([n - 1]))  # the last id still decodes
    with pytest.raises(ValueError, match=rf"token id {n + 5}, outside the vocabulary \[0, {n}\)"):
        model.to_str_tokens(torch.tensor([3, n + 5]))


def test_to_string_rejects_a_negative_id(tokenizer):
    model = model_with(tokenizer)
    with pytest.raises(ValueError, match=r"token id -1, outside the vocabulary \[0, "):
        model.to_string(torch.tensor([5, -1]))
    with pytest.raises(ValueError, match=r"token id -3"):
        model.to_string([[1, 2], [-3, 4]])


def test_loss_on_one_token_says_it_needs_two(tokenizer):
    model = model_with(tokenizer)
    tokens = model.to_tokens("Paris", prepend_bos=False)[:, :1]
    with pytest.raises(ValueError, match=r"at least 2 tokens per sequence, got tokens of shape \(1, 1\)"):
        model(tokens, return_type="loss")
    with pytest.raises(ValueError, match="at least 2 tokens"):
        model.loss_fn(model(tokens), tokens)
    assert torch.isfinite(model(model.to_tokens("Paris is"), return_type="loss"))
