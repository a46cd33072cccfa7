"""`HookedEncoder` built from a config: construction, tokens, forward return types, weight views, hooks."""

from __future__ import annotations

import pytest
import torch

from hooked.core.config import HookedTransformerConfig
from hooked.core.errors import InputError
from hooked.models.hooked_encoder import HookedEncoder


def make_wordpiece_tokenizer(inputs=("input_ids", "token_type_ids", "attention_mask")):
    """A tiny BERT-style WordPiece tokenizer ([CLS] a [SEP] b [SEP], token types, [MASK])."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "on", "mat", "dog", "ran", "."]
    tok = Tokenizer(models.WordPiece({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="[PAD]",
        unk_token="[UNK]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        model_input_names=list(inputs),
    )


def config(**overrides) -> HookedTransformerConfig:
    fields = dict(
        d_model=16,
        d_head=4,
        n_layers=2,
        n_ctx=16,
        d_vocab=13,
        act_fn="gelu",
        attention_dir="bidirectional",
        seed=0,
        device="cpu",
    )
    fields.update(overrides)
    return HookedTransformerConfig(**fields)


@pytest.fixture(scope="module")
def model():
    return HookedEncoder(config(), tokenizer=make_wordpiece_tokenizer())


def test_needs_a_tokenizer_or_d_vocab():
    with pytest.raises(AssertionError, match="Must provide a tokenizer if d_vocab is not provided"):
        HookedEncoder(config(d_vocab=-1))
    assert HookedEncoder(config(d_vocab=-1), tokenizer=make_wordpiece_tokenizer()).cfg.d_vocab == 13
    with pytest.raises(InputError, match="from_pretrained"):
        HookedEncoder("bert-base-cased")


def test_to_tokens_returns_tokens_types_and_mask(model):
    tokens, types, mask = model.to_tokens(["the cat sat", "the dog"])
    assert tokens.tolist() == [[2, 5, 6, 7, 3], [2, 5, 10, 3, 0]]
    assert types.tolist() == [[0] * 5, [0] * 5]
    assert mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]]


def test_sentence_pairs_get_token_types(model):
    tokens, types, mask = model.to_tokens([["the cat", "the dog ran"]])
    assert tokens.tolist() == [[2, 5, 6, 3, 5, 10, 11, 3]]
    assert types.tolist() == [[0, 0, 0, 0, 1, 1, 1, 1]]


def test_tokenizer_without_token_types_gives_zeros():
    model = HookedEncoder(config(), tokenizer=make_wordpiece_tokenizer(inputs=("input_ids", "attention_mask")))
    tokens, types, _ = model.to_tokens([["the cat", "the dog"]])
    assert tokens.shape == types.shape and not types.any()


def test_text_input_uses_the_tokenizer_mask(model):
    tokens, types, mask = model.to_tokens(["the cat sat", "the dog"])
    with torch.no_grad():
        from_text = model(["the cat sat", "the dog"])
        from_tokens = model(tokens, token_type_ids=types, one_zero_attention_mask=mask)
        unmasked = model(tokens)
    torch.testing.assert_close(from_text, from_tokens, atol=0, rtol=0)
    assert (from_text[1] - unmasked[1]).abs().max() > 1e-4  # the pad key was masked


def test_return_types(model):
    tokens = torch.tensor([[2, 5, 4, 7, 3]])
    with torch.no_grad():
        logits = model(tokens)
        assert logits.shape == (1, 5, 13)
        assert model(tokens, return_type=None) is None
        prediction = model(tokens, return_type="predictions")
    assert prediction == model.tokenizer.decode(logits[0, 2].argmax())
    two_masks = torch.tensor([[2, 4, 6, 4, 3]])
    with torch.no_grad():
        predictions = model(two_masks, return_type="predictions")
    words = [model.tokenizer.decode(i) for i in model(two_masks)[0, [1, 3]].argmax(-1)]
    assert predictions == [f"Prediction {i}: {w}" for i, w in enumerate(words)]


def test_encoder_output_is_the_last_block_output(model):
    tokens = torch.tensor([[2, 5, 6, 3]])
    _, cache = model.run_with_cache(tokens)
    with torch.no_grad():
        resid = model.encoder_output(tokens)
    torch.testing.assert_close(
        resid, cache["blocks.1.hook_normalized_resid_post"], atol=1e-5, rtol=0
    )  # SDPA vs explicit
    for name in (
        "embed.hook_embed",
        "embed.hook_pos_embed",
        "embed.hook_token_type_embed",
        "hook_full_embed",
        "blocks.0.attn.hook_q",
        "blocks.1.attn.hook_attn_scores",
        "blocks.1.hook_resid_post",
        "mlm_head.ln.hook_normalized",
    ):
        assert name in cache, name


def test_weight_views_stack_layers(model):
    L, H, d, dh = 2, 4, 16, 4
    assert model.W_Q.shape == model.W_K.shape == model.W_V.shape == (L, H, d, dh)
    assert model.W_O.shape == (L, H, dh, d)
    assert model.b_O.shape == (L, d)
    assert model.W_in.shape == (L, d, 64) and model.W_out.shape == (L, 64, d)
    assert model.W_E is model.embed.embed.W_E and model.W_pos is model.embed.pos_embed.W_pos
    assert model.W_E_pos.shape == (13 + 16, d)
    assert model.W_U.shape == (d, 13)
    torch.testing.assert_close(model.QK.AB[1, 2], model.W_Q[1, 2] @ model.W_K[1, 2].T, atol=1e-6, rtol=0)
    torch.testing.assert_close(model.OV.AB[0, 3], model.W_V[0, 3] @ model.W_O[0, 3], atol=1e-6, rtol=0)
    assert model.all_head_labels()[:2] == ["L0H0", "L0H1"]


@pytest.mark.unchecked  # a wrongly typed argument on purpose: the library's own error, which the checks would preempt
def test_bad_mask_is_refused(model):
    tokens = torch.tensor([[2, 5, 6, 3]])
    with pytest.raises(InputError, match="shape"):
        model(tokens, one_zero_attention_mask=torch.ones(1, 3, dtype=torch.long))
    with pytest.raises(InputError, match="only 0"):
        model(tokens, one_zero_attention_mask=torch.full((1, 4), 2))


@pytest.mark.unchecked  # a wrongly typed argument on purpose: the library's own error, which the checks would preempt
def test_bad_ids_are_refused(model):
    from hooked.core.errors import TokenError

    with pytest.raises(TokenError, match="outside the vocabulary"):
        model(torch.tensor([[2, 13, 3]]))
    with pytest.raises(TokenError, match="token_type_ids contains token id 2"):
        model(torch.tensor([[2, 5, 3]]), token_type_ids=torch.tensor([[0, 1, 2]]))
    with pytest.raises(TokenError, match="token_type_ids has shape"):
        model(torch.tensor([[2, 5, 3]]), token_type_ids=torch.tensor([[0, 1]]))
    with pytest.raises(TokenError, match="integer tensor"):
        model(torch.tensor([[2.0, 5.0]]))


def test_predictions_need_a_tokenizer():
    model = HookedEncoder(config())
    with pytest.raises(InputError, match="tokenizer"):
        model(torch.tensor([[2, 4, 3]]), return_type="predictions")
    with pytest.raises(InputError, match="tokenizer"):
        model.to_tokens("the cat")
