"""`BertNextSentencePrediction` over a real `HookedEncoder`: inputs, return types, caching."""

from __future__ import annotations

import pytest
import torch

from hooked.models.hooked_encoder import HookedEncoder
from hooked.models.next_sentence_prediction import PREDICTIONS, BertNextSentencePrediction
from tests.unit.models.test_hooked_encoder import config, make_wordpiece_tokenizer


@pytest.fixture(scope="module")
def nsp():
    return BertNextSentencePrediction(HookedEncoder(config(seed=3), tokenizer=make_wordpiece_tokenizer()))


def test_text_pair_equals_its_tokens(nsp):
    tokens, types, mask = nsp.to_tokens(["the cat sat", "the dog ran"])
    assert types.tolist() == [[0, 0, 0, 0, 0, 1, 1, 1, 1]]
    with torch.no_grad():
        from_text = nsp(["the cat sat", "the dog ran"])
        from_tokens = nsp(tokens, token_type_ids=types, one_zero_attention_mask=mask)
        pooled = nsp.model.pooler(nsp.model.encoder_output(tokens, types, mask))
    assert from_text.shape == (1, 2)
    torch.testing.assert_close(from_text, from_tokens, atol=0, rtol=0)
    torch.testing.assert_close(from_text, nsp.model.nsp_head(pooled), atol=0, rtol=0)


def test_return_types_and_refusals(nsp):
    pair = ["the cat sat", "the dog ran"]
    with torch.no_grad():
        logits = nsp(pair)
        assert nsp(pair, return_type=None) is None
        assert nsp(pair, return_type="predictions") == PREDICTIONS[logits.argmax(-1).item()]
    with pytest.raises(ValueError, match="exactly two sentences"):
        nsp(["the cat"])
    with pytest.raises(ValueError, match="token_type_ids"):
        nsp(torch.tensor([[2, 5, 3]]))


def test_run_with_cache_returns_nsp_logits_and_restores_forward(nsp):
    logits, cache = nsp.run_with_cache(["the cat", "the dog"])
    assert logits.shape == (1, 2)
    torch.testing.assert_close(cache["nsp_head.hook_nsp_out"], logits, atol=0, rtol=0)
    assert cache["pooler.hook_pooler_out"].shape == (1, 16)
    assert "forward" not in vars(nsp.model)  # the MLM forward is back
    assert nsp.model(torch.tensor([[2, 5, 3]])).shape == (1, 3, 13)
