"""T5 (`HookedEncoderDecoder`) against HuggingFace eager, float32.

Tiny random `T5ForConditionalGeneration`s (the original ReLU T5, whose decoder output is
rescaled before the tied unembedding, and the gated-GELU v1.1 layout, which is not), every
parameter redrawn, saved to disk and loaded from there. The relative-position table is small
(8 buckets, max distance 16) so prompts of 13 tokens reach the logarithmic buckets.
"""

from __future__ import annotations

import pytest
import torch

from hooked.models.hooked_encoder_decoder import HookedEncoderDecoder
from tests.helpers import max_abs
from tests.tiny_models import T5_EOS as EOS
from tests.tiny_models import VOCAB, tiny_t5

ATOL = 1e-5
HF_CLASSES = ("T5ForConditionalGeneration",)

CONFIGS = {
    "t5_relu_rescaled": dict(feed_forward_proj="relu"),
    "t5_v1_1_gated_gelu": dict(feed_forward_proj="gated-gelu", tie_word_embeddings=False),
}


@pytest.fixture(params=list(CONFIGS), scope="module")
def pair(request, tmp_path_factory):
    hf = tiny_t5(len(request.param), **CONFIGS[request.param])
    path = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(path)
    return hf, HookedEncoderDecoder.from_pretrained(str(path))


def inputs(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(2, VOCAB, (3, 13), generator=g)
    mask = torch.ones_like(tokens)
    mask[1, 9:], mask[2, 4:] = 0, 0  # right padding, as T5's tokenizer pads
    decoder = torch.randint(2, VOCAB, (3, 7), generator=g)
    decoder[:, 0] = 0  # the decoder start token
    return tokens, mask, decoder


def test_parity_suite_covers_t5():
    from hooked import loading

    assert {type(tiny_t5(0)).__name__} == set(HF_CLASSES)
    assert {name: loading.registry.MODEL_CLASS_ARCHITECTURES[name][0] for name in HF_CLASSES} == dict.fromkeys(
        HF_CLASSES, "HookedEncoderDecoder"
    )


def test_logits_match_hf(pair):
    hf, model = pair
    tokens, mask, decoder = inputs()
    with torch.no_grad():
        ref = hf(input_ids=tokens, attention_mask=mask, decoder_input_ids=decoder).logits
        ours = model(tokens, decoder_input=decoder, one_zero_attention_mask=mask)
    assert max_abs(ref, ours) < ATOL


def test_every_block_output_matches_hf(pair):
    hf, model = pair
    tokens, mask, decoder = inputs(1)
    blocks = list(hf.encoder.block) + list(hf.decoder.block)
    outputs = []
    handles = [
        b.register_forward_hook(lambda m, i, o: outputs.append(o[0] if isinstance(o, tuple) else o)) for b in blocks
    ]
    try:
        with torch.no_grad():
            ref = hf(input_ids=tokens, attention_mask=mask, decoder_input_ids=decoder)
    finally:
        for h in handles:
            h.remove()
    with torch.no_grad():
        logits, cache = model.run_with_cache(tokens, decoder_input=decoder, one_zero_attention_mask=mask)
        encoder_out, _ = model.encode(tokens, mask)
    n = model.cfg.n_layers
    names = [f"encoder.{layer}.hook_resid_post" for layer in range(n)] + [
        f"decoder.{layer}.hook_resid_post" for layer in range(n)
    ]
    assert len(outputs) == len(names) == 4
    for name, hf_out in zip(names, outputs, strict=True):
        assert max_abs(hf_out, cache[name]) < ATOL, name
    assert max_abs(ref.encoder_last_hidden_state, encoder_out) < ATOL
    assert max_abs(ref.logits, logits) < ATOL  # the explicit (pattern-materialising) path too


def test_padded_batch_equals_prompts_alone(pair):
    _, model = pair
    tokens, mask, decoder = inputs(2)
    with torch.no_grad():
        batched = model(tokens, decoder_input=decoder, one_zero_attention_mask=mask)
        for row in range(tokens.shape[0]):
            n = int(mask[row].sum())
            alone = model(tokens[row : row + 1, :n], decoder_input=decoder[row : row + 1])
            assert max_abs(batched[row : row + 1], alone) < ATOL, row


def until_eos(row: torch.Tensor) -> list[int]:
    ids = row.tolist()
    return ids[: ids.index(EOS) + 1] if EOS in ids else ids


@pytest.mark.parametrize("use_cache", [True, False])
def test_greedy_generate_matches_hf(pair, use_cache):
    hf, model = pair
    tokens, mask, _ = inputs(3)
    with torch.no_grad():
        ref = hf.generate(tokens, attention_mask=mask, max_new_tokens=10, do_sample=False)
    ours = model.generate(
        tokens,
        one_zero_attention_mask=mask,
        max_new_tokens=10,
        do_sample=False,
        eos_token_id=EOS,
        verbose=False,
        use_past_kv_cache=use_cache,
    )
    # HF pads finished rows with the pad token, hooked (as TransformerLens) with EOS: compare up to EOS
    assert [until_eos(r) for r in ref] == [until_eos(r) for r in ours]
    assert ours.shape[1] <= 11


def test_sampling_is_reproducible_and_respects_top_k(pair):
    _, model = pair
    tokens, mask, _ = inputs(4)
    runs = []
    for _ in range(2):
        torch.manual_seed(7)
        runs.append(model.generate(tokens, mask, max_new_tokens=6, stop_at_eos=False, top_k=1, verbose=False))
    greedy = model.generate(tokens, mask, max_new_tokens=6, stop_at_eos=False, do_sample=False, verbose=False)
    assert torch.equal(runs[0], runs[1])
    assert torch.equal(runs[0], greedy)  # top-1 sampling is greedy


def test_cross_attention_pattern_shape_and_padding(pair):
    _, model = pair
    tokens, mask, decoder = inputs(5)
    _, cache = model.run_with_cache(tokens, decoder_input=decoder, one_zero_attention_mask=mask)
    pattern = cache["decoder.1.cross_attn.hook_pattern"]
    assert pattern.shape == (3, model.cfg.n_heads, decoder.shape[1], tokens.shape[1])
    assert float(pattern[2, :, :, 4:].abs().max()) == 0.0  # padded encoder positions get no attention
    self_pattern = cache["decoder.0.attn.hook_pattern"]
    assert float(torch.triu(self_pattern, diagonal=1).abs().max()) == 0.0  # the decoder is causal
    for name in ("decoder.0.hook_cross_attn_out", "decoder.0.hook_resid_mid_cross", "encoder.0.attn.rel_pos_hook"):
        assert name in cache
