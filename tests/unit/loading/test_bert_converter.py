"""`loading/bert.py` and `loading/encoders.py`: pure BERT converters on plain HF state dicts."""

from __future__ import annotations

import pytest
import torch

from hooked.loading.bert import HEAD_PREFIXES, convert_bert_config, convert_bert_weights, present_heads


def hf_config(**overrides):
    from transformers import BertConfig

    fields = dict(
        vocab_size=20,
        hidden_size=8,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=16,
        max_position_embeddings=10,
    )
    fields.update(overrides)
    return BertConfig(**fields)


def state_of(cls_name: str, **overrides) -> tuple[dict, object]:
    import transformers

    from hooked.core.config import HookedTransformerConfig

    hf = getattr(transformers, cls_name)(hf_config(**overrides))
    return hf.state_dict(), HookedTransformerConfig.from_dict(convert_bert_config(hf.config))


def test_config():
    fields = convert_bert_config(hf_config(hidden_act="gelu_new", layer_norm_eps=1e-7))
    assert fields["attention_dir"] == "bidirectional"
    assert (fields["d_model"], fields["d_head"], fields["n_heads"], fields["d_mlp"]) == (8, 4, 2, 16)
    assert (fields["n_ctx"], fields["d_vocab"], fields["eps"], fields["act_fn"]) == (10, 20, 1e-7, "gelu_new")


def test_relative_positions_and_decoders_are_refused():
    with pytest.raises(NotImplementedError, match="relative_key"):
        convert_bert_config(hf_config(position_embedding_type="relative_key"))
    with pytest.raises(NotImplementedError, match="is_decoder"):
        convert_bert_config(hf_config(is_decoder=True))


@pytest.mark.parametrize(
    "cls_name, heads",
    [
        ("BertForPreTraining", {"mlm", "pooler", "nsp"}),
        ("BertForMaskedLM", {"mlm"}),
        ("BertForNextSentencePrediction", {"pooler", "nsp"}),
        ("BertModel", {"pooler"}),
    ],
)
def test_each_class_converts_the_heads_it_has(cls_name, heads):
    state, cfg = state_of(cls_name)
    sd = convert_bert_weights(state, cfg)
    assert present_heads(sd) == heads and set(HEAD_PREFIXES) >= heads
    prefix = "" if cls_name == "BertModel" else "bert."
    q = state[prefix + "encoder.layer.0.attention.self.query.weight"]  # [head * d_head, d_model]
    assert sd["blocks.0.attn.W_Q"].shape == (2, 8, 4)
    torch.testing.assert_close(sd["blocks.0.attn.W_Q"][1], q[4:].T, atol=0, rtol=0)  # head 1 = rows 4..7
    assert sd["embed.token_type_embed.W_token_type"].shape == (2, 8)


def test_masked_lm_unembedding_is_tied_when_the_decoder_is_not_stored():
    state, cfg = state_of("BertForMaskedLM")
    del state["cls.predictions.decoder.weight"]  # as safetensors stores a tied matrix once
    sd = convert_bert_weights(state, cfg)
    assert sd["unembed.W_U"].data_ptr() == state["bert.embeddings.word_embeddings.weight"].data_ptr()
    assert sd["unembed.W_U"].shape == (8, 20)


def test_encoder_classes_are_not_decoder_architectures():
    from hooked import loading
    from hooked.loading.encoders import ENCODER_ARCHITECTURES, get_encoder_architecture

    assert get_encoder_architecture("BertModel").config is convert_bert_config
    assert not set(ENCODER_ARCHITECTURES) & set(loading.ARCHITECTURES)
    with pytest.raises(NotImplementedError, match="BertForMaskedLM"):
        get_encoder_architecture("GPT2LMHeadModel")


def test_unknown_from_pretrained_arguments_are_refused():
    from hooked.models.hooked_encoder import HookedEncoder

    with pytest.raises(TypeError, match="fold_lnn"):
        HookedEncoder.from_pretrained("any", fold_lnn=True)


def test_distilbert_converts_with_zero_token_types():
    from transformers import DistilBertConfig, DistilBertForMaskedLM

    from hooked.core.config import HookedTransformerConfig
    from hooked.loading.distilbert import convert_distilbert_config, convert_distilbert_weights

    hf = DistilBertForMaskedLM(
        DistilBertConfig(vocab_size=20, dim=8, n_layers=1, n_heads=2, hidden_dim=16, max_position_embeddings=10)
    )
    fields = convert_distilbert_config(hf.config)
    assert fields["eps"] == 1e-12 and fields["attention_dir"] == "bidirectional"
    sd = convert_distilbert_weights(hf.state_dict(), HookedTransformerConfig.from_dict(fields))
    assert not sd["embed.token_type_embed.W_token_type"].any()
    assert present_heads(sd) == {"mlm"}
    torch.testing.assert_close(
        sd["blocks.0.ln1.w"], hf.distilbert.transformer.layer[0].sa_layer_norm.weight, atol=0, rtol=0
    )


def test_transformer_lens_names_resolve_to_hub_ids(tmp_path, monkeypatch):
    from hooked.models.hooked_encoder import HookedEncoder

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FileNotFoundError, match="google-bert/bert-base-cased"):
        HookedEncoder.from_pretrained("bert-base-cased", cache_dir=str(tmp_path))
    with pytest.raises(NotImplementedError, match="checkpoint"):
        HookedEncoder.from_pretrained("bert-base-cased", checkpoint_index=3)
