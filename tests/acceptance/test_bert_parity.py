"""BERT (`HookedEncoder`, `BertNextSentencePrediction`) against HuggingFace eager attention, float32.

Tiny random BERTs of every supported class are saved to disk with every parameter redrawn,
loaded back through `HookedEncoder.from_pretrained(path)`, and compared with HF on the
same tokens, token types and padding mask: logits, every block output, the pooler and
the next-sentence logits, all two-sided max-abs within 1e-5 (rtol 0).
"""

from __future__ import annotations

import pytest
import torch

from hooked.core.errors import InputError
from hooked.models.hooked_encoder import HookedEncoder
from hooked.models.next_sentence_prediction import BertNextSentencePrediction

ATOL = 1e-5
VOCAB = 96
CLASSES = ("BertForPreTraining", "BertForMaskedLM", "BertForNextSentencePrediction", "BertModel")


def tiny_bert(cls_name: str, seed: int = 0, **overrides):
    """A random 2-layer BERT (d_model 32, 4 heads); q/k N(0, 0.25²), other weights N(0, 0.1²),
    norm gains 1 + N(0, 0.2²)."""
    import transformers

    kwargs = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=32,
        pad_token_id=0,
        attn_implementation="eager",
    )
    kwargs.update(overrides)
    torch.manual_seed(seed)
    hf = getattr(transformers, cls_name)(transformers.BertConfig(**kwargs)).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "LayerNorm.weight" in name:
                p.copy_(1 + 0.2 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.25 if name.endswith(("query.weight", "key.weight")) else 0.1)
    return hf


@pytest.fixture(scope="module", params=CLASSES)
def pair(request, tmp_path_factory):
    hf = tiny_bert(request.param, seed=CLASSES.index(request.param))
    path = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(path)
    return hf, HookedEncoder.from_pretrained(str(path), device="cpu")


def batch(seed: int = 0):
    """Two rows of 10 tokens, sentence B from position 4, the second row right-padded after 7 tokens."""
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(1, VOCAB, (2, 10), generator=gen)
    types = torch.zeros(2, 10, dtype=torch.long)
    types[:, 4:] = 1
    mask = torch.ones(2, 10, dtype=torch.long)
    mask[1, 7:] = 0
    tokens[1, 7:] = 0
    return tokens, types, mask


def max_abs(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


def hf_outputs(hf, tokens, types, mask):
    with torch.no_grad():
        return hf(tokens, token_type_ids=types, attention_mask=mask, output_hidden_states=True)


def test_every_bert_class_is_registered():
    from hooked.loading.encoders import ENCODER_ARCHITECTURES

    covered = set(CLASSES) | {"DistilBertForMaskedLM", "DistilBertModel"}
    assert covered == set(ENCODER_ARCHITECTURES)  # a class losing its parity case fails here
    assert not covered & set(
        __import__("hooked.loading", fromlist=["ARCHITECTURES"]).ARCHITECTURES
    )  # never loads into HookedTransformer


def test_every_block_output_matches_hf(pair):
    hf, model = pair
    tokens, types, mask = batch()
    out = hf_outputs(hf, tokens, types, mask)
    _, cache = model.run_with_cache(tokens, return_type=None, token_type_ids=types, one_zero_attention_mask=mask)
    assert max_abs(cache["hook_full_embed"], out.hidden_states[0]) <= ATOL
    for layer in range(model.cfg.n_layers):
        ours = cache[f"blocks.{layer}.hook_normalized_resid_post"]
        assert max_abs(ours, out.hidden_states[layer + 1]) <= ATOL, f"block {layer}"


def test_masked_lm_logits_match_hf(pair):
    hf, model = pair
    tokens, types, mask = batch(1)
    if "mlm" in model.missing_heads:  # BertModel, BertForNextSentencePrediction: no masked-LM head
        with pytest.raises(InputError, match="'mlm' head"):
            model(tokens, token_type_ids=types, one_zero_attention_mask=mask)
        return
    out = hf_outputs(hf, tokens, types, mask)
    expected = out.prediction_logits if hasattr(out, "prediction_logits") else out.logits
    with torch.no_grad():
        logits = model(tokens, token_type_ids=types, one_zero_attention_mask=mask)
    assert logits.shape == expected.shape
    assert max_abs(logits, expected) <= ATOL


def test_next_sentence_logits_match_hf(pair):
    hf, model = pair
    tokens, types, mask = batch(2)
    out = hf_outputs(hf, tokens, types, mask)
    nsp = BertNextSentencePrediction(model)
    if "nsp" in model.missing_heads:
        with pytest.raises(InputError, match="'(pooler|nsp)' head"):
            nsp(tokens, token_type_ids=types, one_zero_attention_mask=mask)
        return
    expected = out.seq_relationship_logits if hasattr(out, "seq_relationship_logits") else out.logits
    with torch.no_grad():
        logits = nsp(tokens, token_type_ids=types, one_zero_attention_mask=mask)
    assert logits.shape == (2, 2)
    assert max_abs(logits, expected) <= ATOL


def test_pooler_matches_hf_base_model():
    hf = tiny_bert("BertModel", seed=7)
    model = HookedEncoder.from_pretrained("bert", hf_model=hf, device="cpu")
    tokens, types, mask = batch(3)
    out = hf_outputs(hf, tokens, types, mask)
    with torch.no_grad():
        resid = model.encoder_output(tokens, types, mask)
        pooled = model.pooler(resid)
    assert max_abs(resid, out.last_hidden_state) <= ATOL
    assert max_abs(pooled, out.pooler_output) <= ATOL
    assert model.missing_heads == {"mlm", "nsp"}
    with pytest.raises(InputError, match="'mlm' head"):
        model(tokens)


def test_padded_batch_equals_each_prompt_alone():
    hf = tiny_bert("BertForPreTraining", seed=11)
    model = HookedEncoder.from_pretrained("bert", hf_model=hf, device="cpu")
    nsp = BertNextSentencePrediction(model)
    lengths = (9, 4, 6)
    gen = torch.Generator().manual_seed(5)
    prompts = [torch.randint(1, VOCAB, (n,), generator=gen) for n in lengths]
    tokens = torch.zeros(len(lengths), max(lengths), dtype=torch.long)
    mask = torch.zeros_like(tokens)
    for i, p in enumerate(prompts):
        tokens[i, : len(p)], mask[i, : len(p)] = p, 1
    types = torch.zeros_like(tokens)
    types[:, 2:] = 1
    with torch.no_grad():
        logits = model(tokens, token_type_ids=types, one_zero_attention_mask=mask)
        nsp_logits = nsp(tokens, token_type_ids=types, one_zero_attention_mask=mask)
        for i, p in enumerate(prompts):
            n = len(p)
            alone = model(p[None], token_type_ids=types[i : i + 1, :n])
            assert max_abs(logits[i, :n], alone[0]) <= ATOL
            assert max_abs(nsp_logits[i], nsp(p[None], token_type_ids=types[i : i + 1, :n])[0]) <= ATOL


def test_padding_keys_get_no_attention():
    hf = tiny_bert("BertForMaskedLM", seed=3)
    model = HookedEncoder.from_pretrained("bert", hf_model=hf, device="cpu")
    tokens, types, mask = batch(4)
    _, cache = model.run_with_cache(tokens, token_type_ids=types, one_zero_attention_mask=mask)
    pattern = cache["blocks.1.attn.hook_pattern"]  # [batch, head, query, key]
    assert pattern[1, :, :, 7:].abs().max().item() == 0.0
    torch.testing.assert_close(pattern.sum(-1), torch.ones(pattern.shape[:-1]), atol=1e-6, rtol=0)


def test_in_memory_model_loads_like_the_saved_one(tmp_path):
    hf = tiny_bert("BertForPreTraining", seed=13)
    hf.save_pretrained(tmp_path)
    from_disk = HookedEncoder.from_pretrained(str(tmp_path), device="cpu")
    in_memory = HookedEncoder.from_pretrained("bert", hf_model=hf, device="cpu")
    disk_state, memory_state = from_disk.state_dict(), in_memory.state_dict()
    assert disk_state.keys() == memory_state.keys()
    for name, tensor in disk_state.items():
        assert torch.equal(tensor, memory_state[name]), name


def test_tanh_gelu_variant_matches_hf():
    hf = tiny_bert("BertForMaskedLM", seed=17, hidden_act="gelu_new")
    model = HookedEncoder.from_pretrained("bert", hf_model=hf, device="cpu")
    tokens, types, mask = batch(5)
    out = hf_outputs(hf, tokens, types, mask)
    with torch.no_grad():
        logits = model(tokens, token_type_ids=types, one_zero_attention_mask=mask)
    assert model.cfg.act_fn == "gelu_new"
    assert max_abs(logits, out.logits) <= ATOL


# -- DistilBERT: the same blocks without token types ----------------------------------------


def tiny_distilbert(cls_name: str, seed: int = 0):
    import transformers

    torch.manual_seed(seed)
    config = transformers.DistilBertConfig(
        vocab_size=VOCAB,
        dim=32,
        n_layers=2,
        n_heads=4,
        hidden_dim=64,
        max_position_embeddings=32,
        pad_token_id=0,
        attn_implementation="eager",
    )
    hf = getattr(transformers, cls_name)(config).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "layer_norm.weight" in name or "LayerNorm.weight" in name:
                p.copy_(1 + 0.2 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.25 if name.endswith(("q_lin.weight", "k_lin.weight")) else 0.1)
    return hf


@pytest.mark.parametrize("cls_name", ["DistilBertForMaskedLM", "DistilBertModel"])
def test_distilbert_matches_hf(cls_name, tmp_path):
    hf = tiny_distilbert(cls_name, seed=19)
    hf.save_pretrained(tmp_path)
    model = HookedEncoder.from_pretrained(str(tmp_path), device="cpu")
    tokens, _, mask = batch(6)
    with torch.no_grad():
        out = hf(tokens, attention_mask=mask, output_hidden_states=True)
    logits, cache = model.run_with_cache(
        tokens, return_type=None if "mlm" in model.missing_heads else "logits", one_zero_attention_mask=mask
    )
    for layer in range(model.cfg.n_layers):
        assert max_abs(cache[f"blocks.{layer}.hook_normalized_resid_post"], out.hidden_states[layer + 1]) <= ATOL
    if cls_name == "DistilBertModel":
        assert model.missing_heads == {"mlm", "pooler", "nsp"} and logits is None
    else:
        assert model.missing_heads == {"pooler", "nsp"}
        assert max_abs(logits, out.logits) <= ATOL
