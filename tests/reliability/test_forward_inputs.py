"""Bad inputs to forward and tokenization: each raises one clear error before the forward pass."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hooked import HookedTransformer, HookedTransformerConfig
from hooked.core.errors import AttentionMaskError, InputError, InputTypeError, TokenError, TokenizerError

TOKENS = torch.tensor([[3, 17, 42, 7]])  # [batch, pos]


@pytest.mark.parametrize(
    "bad, match",
    [
        (torch.tensor([[5, 1000]]), r"token id 1000, outside the vocabulary \[0, 1000\)"),
        (torch.tensor([[5, -3]]), r"token id -3"),
        (torch.tensor([7, 5000]), r"token id 5000"),
        (torch.zeros(1, 4), r"float input .*shape \(1, 4\)"),
        (torch.zeros(1, 2, 3, dtype=torch.long), r"shape \(1, 2, 3\)"),
        (torch.ones(1, 4, dtype=torch.bool), r"dtype torch\.bool"),
        (torch.zeros(1, 0, dtype=torch.long), r"empty \(shape \(1, 0\)\)"),
        (torch.zeros(0, dtype=torch.long), r"empty \(shape \(0,\)\)"),
        (torch.zeros(1, 3, 7), r"d_model=64.*shape \(1, 3, 7\)"),
        (torch.zeros(1, 0, 64), r"no positions"),
    ],
    ids=["id=d_vocab", "negative", "1d-out-of-range", "float-2d", "int-3d", "bool", "empty-2d", "empty-1d",
         "embeds-wrong-d_model", "embeds-no-positions"],
)  # fmt: skip
def test_bad_token_tensors(model, unchanged, bad, match):
    with unchanged(model), pytest.raises(TokenError, match=match):
        model(bad)


def test_token_errors_are_assertion_errors_too(model):
    with pytest.raises(AssertionError):  # TransformerLens asserted on these
        model(torch.tensor([[1, 10_000]]))


@pytest.mark.parametrize(
    "bad, error, match",
    [
        ([], InputError, "empty list of prompts"),
        (["fine", 3], InputTypeError, r"item 1 is int \(3\)"),
        (np.array([[1, 2]]), InputTypeError, "got ndarray"),
        (7, InputTypeError, "got int"),
    ],
    ids=["empty-list", "list-with-int", "ndarray", "int"],
)
def test_bad_input_types(model, unchanged, bad, error, match):
    with unchanged(model), pytest.raises(error, match=match):
        model(bad)


def test_empty_string_without_bos(model, unchanged):
    with unchanged(model), pytest.raises(TokenError, match=r"input '' tokenizes to no tokens.*prepend_bos=True"):
        model("", prepend_bos=False)


def test_one_empty_prompt_in_a_batch(model, unchanged):
    with unchanged(model), pytest.raises(TokenError, match="input '' tokenizes"):
        model(["The quick brown fox", ""], prepend_bos=False)


def test_empty_string_with_bos_runs(model):
    assert model("").shape == (1, 1, model.cfg.d_vocab_out)  # BOS alone is a valid input


@pytest.mark.parametrize("bad", [TOKENS, "some text"], ids=["token-ids", "text"])
def test_start_at_layer_needs_a_residual(model, unchanged, bad):
    with unchanged(model), pytest.raises(InputError, match=r"start_at_layer=1 takes the residual stream"):
        model(bad, start_at_layer=1)


def test_start_at_layer_with_float_tokens(model, unchanged):
    resid = model(TOKENS, stop_at_layer=1)
    with (
        unchanged(model),
        pytest.raises(TokenError, match=r"tokens must be integer token ids, got dtype torch.float32"),
    ):
        model(resid, start_at_layer=1, tokens=TOKENS.float(), return_type="loss")


def test_loss_from_a_residual_needs_tokens(model, unchanged):
    resid = model(TOKENS, stop_at_layer=1)
    with unchanged(model), pytest.raises(ValueError, match="tokens="):
        model(resid, start_at_layer=1, return_type="loss")


def test_unknown_return_type(model, unchanged):
    with unchanged(model), pytest.raises(ValueError, match="'logit'"):
        model(TOKENS, return_type="logit")


def test_input_longer_than_learned_positions(model, unchanged):
    long = torch.randint(0, 100, (1, model.cfg.n_ctx + 1))
    with unchanged(model), pytest.raises(TokenError, match=r"129 positions .* n_ctx=128"):
        model(long)


@pytest.mark.parametrize(
    "mask, match",
    [
        (torch.tensor([[1.0, 0.5, 1.0, 1.0]]), r"dtype torch\.float32"),
        (torch.tensor([[1, 2, 1, 1]]), r"contains 2"),
        (torch.tensor([[1, -1, 1, 1]]), r"contains -1"),
        (torch.tensor([[1, 1, 1]]), r"shape \(1, 3\); expected \[batch, pos\] = \(1, 4\)"),
        (torch.tensor([1, 1, 1, 1]), r"shape \[batch, pos\], got shape \(4,\)"),
        ([[1, 1, 1, 1]], r"tensor of 0/1, got list"),
    ],
    ids=["float", "two", "negative", "short", "1d", "list"],
)
def test_bad_attention_masks(model, unchanged, mask, match):
    with unchanged(model), pytest.raises(AttentionMaskError, match=match):
        model(TOKENS, attention_mask=mask)


def test_bool_and_int_masks_agree(model):
    mask = torch.tensor([[0, 1, 1, 1]])
    torch.testing.assert_close(
        model(TOKENS, attention_mask=mask), model(TOKENS, attention_mask=mask.bool()), atol=0, rtol=0
    )


def test_invalid_padding_side(model, unchanged):
    with unchanged(model), pytest.raises(ValueError, match="'middle'"):
        model(["a b", "c"], padding_side="middle")


def test_to_tokens_rejects_non_text(model, unchanged):
    with unchanged(model), pytest.raises(InputTypeError, match=r"got int \(5\)"):
        model.to_tokens(5)


# -- tokenizers without special tokens: never mutated, clear errors ---------------------------------
def _bare_tokenizer():
    """A trained tokenizer with no special tokens at all (no BOS, EOS or pad)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from tests.tiny_models import CORPUS

    raw = Tokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.train_from_iterator(
        CORPUS, trainers.BpeTrainer(vocab_size=200, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    )
    return PreTrainedTokenizerFast(tokenizer_object=raw)


@pytest.fixture(scope="module")
def bare_model():
    tok = _bare_tokenizer()
    cfg = HookedTransformerConfig(d_model=16, d_head=8, n_layers=1, n_ctx=32, act_fn="relu", d_vocab=len(tok), seed=0)
    return HookedTransformer(cfg, tokenizer=tok), tok


def test_prepend_bos_without_bos_token(bare_model, unchanged):
    model, tok = bare_model
    with (
        unchanged(model, tok),
        pytest.raises(TokenizerError, match=r"prepend_bos=True.*no BOS token.*prepend_bos=False"),
    ):
        model("hello")
    assert model("hello", prepend_bos=False).shape[1] > 0  # the fix works


def test_batch_without_pad_token(bare_model, unchanged):
    model, tok = bare_model
    with unchanged(model, tok), pytest.raises(TokenizerError, match="no pad token"):
        model(["The quick brown fox", "a"], prepend_bos=False)


def test_caller_tokenizer_is_never_mutated(tok):
    before = (tok.bos_token, tok.eos_token, tok.pad_token, tok.padding_side)
    cfg = HookedTransformerConfig(d_model=16, d_head=8, n_layers=1, n_ctx=32, act_fn="relu", d_vocab=len(tok))
    model = HookedTransformer(cfg, tokenizer=tok)
    model(["a b", "The quick brown fox"], padding_side="left")
    assert (tok.bos_token, tok.eos_token, tok.pad_token, tok.padding_side) == before
    assert model.tokenizer is not tok and model.tokenizer.pad_token == tok.eos_token  # filled on a copy


def test_bare_tokenizer_is_not_given_tokens_outside_its_vocabulary():
    tok = _bare_tokenizer()
    cfg = HookedTransformerConfig(d_model=16, d_head=8, n_layers=1, n_ctx=32, act_fn="relu", d_vocab=len(tok))
    model = HookedTransformer(cfg, tokenizer=tok)
    assert model.tokenizer.eos_token is None and model.tokenizer.bos_token is None  # "<|endoftext|>" is not in it
    assert tok.eos_token is None


def test_start_at_layer_with_a_residual_of_the_wrong_width(model, unchanged):
    with (
        unchanged(model),
        pytest.raises(InputError, match=r"d_model=64\] entering that block as input, got torch.float32 \(1, 4, 32\)"),
    ):
        model(torch.zeros(1, 4, 32), start_at_layer=1)


def test_generate_accepts_unbatched_embeddings(model):
    embeds = model.embed(TOKENS)[0]  # [pos, d_model]
    out = model.generate(embeds, max_new_tokens=2, do_sample=False, verbose=False, return_type="tokens")
    assert out.shape == (1, 2)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(start_at_layer=9), InputError, r"start_at_layer=9 is out of range: .* allow -2 to 2"),
        (dict(stop_at_layer=-3), InputError, r"stop_at_layer=-3 is out of range"),
        (dict(stop_at_layer="1"), InputTypeError, r"stop_at_layer must be an int or None, got str \('1'\)"),
    ],
    ids=["start-9", "stop--3", "stop-str"],
)
def test_layer_range_arguments(model, unchanged, kwargs, error, match):
    resid = model(TOKENS, stop_at_layer=1) if "start_at_layer" in kwargs else TOKENS
    with unchanged(model), pytest.raises(error, match=match):
        model(resid, **kwargs)


def test_token_ids_outside_the_vocabulary_in_helpers(model, unchanged):
    with unchanged(model), pytest.raises(TokenError, match="token id 1000000"):
        model.tokens_to_residual_directions(10**6)
    with unchanged(model), pytest.raises(TokenError, match=r"int_token contains token id 5000"):
        model.to_single_str_token(5000)
