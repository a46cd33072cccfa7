"""HookedEncoderDecoder: cached decoding, string inputs, weight views, construction and refusals."""

from __future__ import annotations

import pytest
import torch

from hooked.generation.kv_cache import HookedTransformerKeyValueCacheEntry
from hooked.models.hooked_encoder_decoder import HookedEncoderDecoder
from tests.acceptance.test_t5_parity import inputs
from tests.tiny_models import CORPUS, tiny_t5
from tests.unit.components.test_t5 import t5_cfg


def t5_tokenizer():
    """A byte-level BPE with T5's special ids: <pad> 0, </s> 1 appended to every text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<pad>", "</s>", "<unk>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(CORPUS, trainer)
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>", unk_token="<unk>")


@pytest.fixture(scope="module")
def pair():
    hf = tiny_t5(5, vocab_size=320)
    return hf, HookedEncoderDecoder.from_pretrained("tiny-t5", hf_model=hf, tokenizer=t5_tokenizer())


def test_cached_decoding_equals_full_decoder(pair):
    _, model = pair
    tokens, mask, decoder = inputs(6)
    with torch.no_grad():
        encoder_resid, encoder_mask = model.encode(tokens, mask)
        full = model.decode(decoder, encoder_resid, encoder_mask)
        caches = [HookedTransformerKeyValueCacheEntry(3, 4, 8) for _ in model.decoder]
        cross = [block.cross_attn.project_kv(encoder_resid) for block in model.decoder]
        steps = [model.decode(decoder[:, :3], encoder_resid, encoder_mask, caches, cross)]
        steps += [model.decode(decoder[:, i : i + 1], encoder_resid, encoder_mask, caches, cross) for i in range(3, 7)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=0)


def test_string_input_equals_tokens_with_mask(pair):
    hf, model = pair
    texts = ["The quick brown fox", "Hooks let you read and rewrite every activation."]
    tokens, mask = model.to_tokens(texts)
    assert tokens.shape == mask.shape and int(mask[0].sum()) < tokens.shape[1]  # right-padded
    start = torch.zeros(2, 1, dtype=torch.long)
    with torch.no_grad():
        from_text = model(texts)
        from_tokens = model(tokens, decoder_input=start, one_zero_attention_mask=mask)
        ref = hf(input_ids=tokens, attention_mask=mask, decoder_input_ids=start).logits
    assert torch.equal(from_text, from_tokens)
    torch.testing.assert_close(from_text, ref, atol=1e-5, rtol=0)


def test_generate_from_a_string_returns_text(pair):
    _, model = pair
    text = model.generate("The quick brown fox", max_new_tokens=4, do_sample=False, verbose=False)
    tokens = model.generate(model.to_tokens("The quick brown fox")[0], max_new_tokens=4, do_sample=False, verbose=False)
    assert isinstance(text, str)
    assert text == model.tokenizer.decode(tokens[0], skip_special_tokens=True)


def test_token_input_needs_decoder_input(pair):
    _, model = pair
    with pytest.raises(ValueError, match="decoder_input"):
        model(torch.tensor([[5, 6, 7]]))


def test_weight_views_stack_encoder_then_decoder(pair):
    _, model = pair
    n, H = model.cfg.n_layers, model.cfg.n_heads
    assert model.W_Q.shape == (2 * n, H, 32, 8)
    assert torch.equal(model.W_K[n], model.decoder[0].attn.W_K)
    assert model.W_in.shape == (2 * n, 32, 64)
    assert model.OV.shape == (2 * n, H, 32, 32)
    assert model.all_head_labels()[:2] == ["EL0H0", "EL0H1"] and model.all_head_labels()[-1] == f"DL{n - 1}H{H - 1}"
    with pytest.raises(NotImplementedError, match="relative"):
        _ = model.W_pos


def test_built_from_a_config_runs():
    model = HookedEncoderDecoder(t5_cfg(seed=0, decoder_start_token_id=0))
    logits = model(torch.tensor([[3, 4, 5]]), decoder_input=torch.tensor([[0, 7]]))
    assert logits.shape == (1, 2, 96) and bool(torch.isfinite(logits).all())
    assert float(model.decoder[0].ln1.w.detach().min()) == 1.0 and float(model.W_Q.detach().std()) > 0


def test_hooked_transformer_names_the_class_for_t5(tmp_path):
    from hooked import HookedTransformer

    tiny_t5(0).save_pretrained(tmp_path)
    with pytest.raises(NotImplementedError, match="HookedEncoderDecoder"):
        HookedTransformer.from_pretrained(str(tmp_path))


def test_unequal_encoder_and_decoder_depths_are_refused():
    from transformers import T5Config

    from hooked.loading.t5 import convert_t5_config

    with pytest.raises(NotImplementedError, match="decoder layers"):
        convert_t5_config(T5Config(num_layers=2, num_decoder_layers=3))


def test_hooked_transformer_refuses_t5_position_scheme():
    from hooked import HookedTransformer
    from hooked.core.errors import ConfigError

    with pytest.raises(ConfigError, match="HookedEncoderDecoder"):
        HookedTransformer(t5_cfg())
