"""TransformerLens-style padding: `tokenizer.padding_side` is the default; raw left-padded ids get a mask."""

from __future__ import annotations

import pytest
import torch

from hooked import HookedTransformer, HookedTransformerConfig
from tests.tiny_models import make_tokenizer

PROMPTS = ["The quick brown fox jumps over the lazy dog.", "Paris"]


@pytest.fixture
def model():
    cfg = HookedTransformerConfig(n_layers=2, d_model=32, d_head=8, n_ctx=64, act_fn="gelu_new", seed=0, device="cpu")
    return HookedTransformer(cfg, tokenizer=make_tokenizer())  # its own tokenizer: these tests set padding_side


def test_tokenizer_padding_side_left_is_honoured(model):
    right = model.to_tokens(PROMPTS)
    model.tokenizer.padding_side = "left"
    left = model.to_tokens(PROMPTS)
    pad = model.tokenizer.pad_token_id
    assert right[1, -1] == pad and left[1, 0] == pad and left[1, -1] != pad
    torch.testing.assert_close(left, model.to_tokens(PROMPTS, padding_side="left"))
    # the last position's logits are the real last token's, as with an unpadded single prompt
    alone = model(PROMPTS[1])[0, -1]
    torch.testing.assert_close(model(PROMPTS)[1, -1], alone, atol=1e-5, rtol=1e-5)


def test_per_call_padding_side_wins_and_mutates_nothing(model):
    model.tokenizer.padding_side = "left"
    tokens = model.to_tokens(PROMPTS, padding_side="right")
    assert tokens[1, -1] == model.tokenizer.pad_token_id
    assert model.tokenizer.padding_side == "left" and model.default_padding_side == "left"
    model.default_padding_side = "right"
    assert model.tokenizer.padding_side == "right"


def test_left_padded_ids_without_a_mask_get_the_inferred_mask(model):
    model.tokenizer.padding_side = "left"
    tokens, mask = model.to_tokens(PROMPTS, return_attention_mask=True)
    assert (mask == 0).any()
    torch.testing.assert_close(model(tokens), model(tokens, attention_mask=mask))
    unmasked = model(tokens, attention_mask=torch.ones_like(mask))
    assert (model(tokens)[1, -1] - unmasked[1, -1]).abs().max() > 1e-3  # the inference did change something
    loss = model(tokens, return_type="loss")
    torch.testing.assert_close(loss, model(tokens, return_type="loss", attention_mask=mask))
