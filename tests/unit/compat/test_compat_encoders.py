"""The alias's encoder and LIT paths: `transformer_lens.HookedEncoder`, `BertNextSentencePrediction`,
`pretrained.weight_conversions.bert`, `components.Bert*` and `transformer_lens.lit`."""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch

from hooked.compat import alias_transformer_lens

alias_transformer_lens()


def test_encoder_names_resolve_to_hooked():
    import transformer_lens
    from transformer_lens import BertNextSentencePrediction, HookedEncoder
    from transformer_lens.components import BertBlock, BertEmbed, BertMLMHead, BertNSPHead, BertPooler, TokenTypeEmbed

    import hooked.components.bert
    from hooked.models.hooked_encoder import HookedEncoder as Native
    from hooked.models.next_sentence_prediction import BertNextSentencePrediction as NativeNSP

    assert HookedEncoder is Native and BertNextSentencePrediction is NativeNSP
    assert transformer_lens.HookedEncoder is Native  # the class, not its module
    for cls in (BertBlock, BertEmbed, BertMLMHead, BertNSPHead, BertPooler, TokenTypeEmbed):
        assert cls is getattr(hooked.components.bert, cls.__name__)


def tiny_pretraining():
    from transformers import BertConfig, BertForPreTraining

    torch.manual_seed(0)
    return BertForPreTraining(
        BertConfig(
            vocab_size=20,
            hidden_size=8,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=16,
            max_position_embeddings=10,
        )
    ).eval()


@pytest.mark.unchecked  # an attribute tree poses as a state dict; beartype's Mapping check would iterate it
@pytest.mark.parametrize("as_object", [False, True])
def test_convert_bert_weights_takes_the_hf_model(as_object):
    from transformer_lens.pretrained.weight_conversions.bert import convert_bert_weights

    from hooked.core.config import HookedTransformerConfig
    from hooked.loading.bert import convert_bert_config

    hf = tiny_pretraining()
    cfg = HookedTransformerConfig.from_dict(convert_bert_config(hf.config))
    model = types.SimpleNamespace(bert=hf.bert, cls=hf.cls) if as_object else hf  # attribute tree, no state_dict
    sd = convert_bert_weights(model, cfg)
    assert {"pooler.W", "nsp_head.W", "mlm_head.W", "unembed.W_U", "blocks.0.ln2.w"} <= set(sd)
    torch.testing.assert_close(sd["nsp_head.W"], hf.cls.seq_relationship.weight.T, atol=0, rtol=0)
    torch.testing.assert_close(sd["unembed.W_U"], hf.bert.embeddings.word_embeddings.weight.T, atol=0, rtol=0)


def test_lit_helpers():
    from transformer_lens.lit.constants import DEFAULTS, HOOK_POINTS, INPUT_FIELDS
    from transformer_lens.lit.utils import (
        batch_examples,
        clean_token_strings,
        get_model_info,
        tensor_to_numpy,
        unbatch_outputs,
    )

    assert INPUT_FIELDS.TEXT == "text" and DEFAULTS.TOP_K == 10
    assert HOOK_POINTS.RESID_PRE_TEMPLATE.format(layer=3) == "blocks.3.hook_resid_pre"
    assert clean_token_strings(["Ġa", "##b", "▁c", "d"]) == ["▁a", "b", "▁c", "d"]
    assert [len(b) for b in batch_examples(list(range(7)), 3)] == [3, 3, 1]
    rows = unbatch_outputs({"x": np.arange(6).reshape(2, 3), "t": [["a"], ["b"]]})
    assert rows[1]["t"] == ["b"] and rows[1]["x"].tolist() == [3, 4, 5]
    half = torch.ones(2, dtype=torch.bfloat16)
    assert tensor_to_numpy(half).dtype == np.float32
    info = get_model_info(types.SimpleNamespace(cfg=types.SimpleNamespace(model_name="m", n_layers=2)))
    assert info["model_name"] == "m" and info["n_layers"] == 2 and info["d_model"] is None


def test_lit_wrappers_say_what_is_missing():
    from transformer_lens import lit

    assert lit.HookedTransformerLITConfig().batch_size == 8
    expected = ImportError if not lit.check_lit_installed() else NotImplementedError
    for make in (
        lambda: lit.HookedTransformerLIT(object()),
        lambda: lit.SimpleTextDataset.from_strings(["a"]),
        lambda: lit.serve({}, {}),
    ):
        with pytest.raises(expected, match="(?i)lit"):
            make()
