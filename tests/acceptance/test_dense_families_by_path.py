"""The dense families of issue 37 load by path (the converter their `config.json` names), and `hooked inspect` runs.

For each HF class: a tiny random checkpoint (config, safetensors, a BPE tokenizer) saved to a directory;
`from_pretrained(PATH)` picks the converter from the checkpoint's `architectures` and gives HF's logits
(unprocessed, float32, atol 1e-5); `hooked inspect "prompt" --model PATH` (default processing) prints
its report. The vocabulary is the tokenizer's (300), so text runs end to end.
"""

from __future__ import annotations

import json

import pytest
import torch

from tests.tiny_models import CLASSIC_FAMILIES, make_tokenizer, tiny_gemma_ple, tiny_hf

VOCAB = 300


def classic(name: str):
    import transformers

    config_cls, model_cls, kwargs = CLASSIC_FAMILIES[name]
    config = getattr(transformers, config_cls)(**dict(kwargs, vocab_size=VOCAB, bos_token_id=1, eos_token_id=2))
    torch.manual_seed(0)
    return getattr(transformers, model_cls)(config).eval()


#: HF class -> builder of a tiny random model with the tokenizer's vocabulary
PLE = dict(vocab_size=VOCAB, vocab_size_per_layer_input=VOCAB)
BUILDERS = {
    "MptForCausalLM": lambda: classic("mpt_6heads_clip_qkv"),
    "CodeGenForCausalLM": lambda: classic("codegen_mp4_rotary8"),
    "XGLMForCausalLM": lambda: classic("xglm_sinusoidal"),
    "HunYuanDenseV1ForCausalLM": lambda: tiny_hf("HunYuanDenseV1", vocab_size=VOCAB, num_key_value_heads=2, head_dim=8),
    "Gemma4ForCausalLM": lambda: tiny_gemma_ple("gemma4_kv_shared_ple", **PLE),
    "Gemma4ForConditionalGeneration": lambda: tiny_gemma_ple("gemma4_image_text_tower", **PLE),
    "Gemma3nForCausalLM": lambda: tiny_gemma_ple("gemma3n_altup_laurel_sparse", **PLE),
}


@pytest.mark.parametrize("hf_class", sorted(BUILDERS))
def test_loads_by_path_and_hooked_inspect_runs(hf_class, tmp_path, capsys):
    from hooked import HookedTransformer
    from hooked.cli import main

    hf = BUILDERS[hf_class]()
    hf.save_pretrained(tmp_path, safe_serialization=True)
    make_tokenizer(prepends_bos=True).save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["architectures"] == [hf_class]
    model = HookedTransformer.from_pretrained_no_processing(str(tmp_path))
    assert model.cfg.original_architecture is not None
    t = torch.randint(3, VOCAB, (1, 10), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert (model(t) - hf(t).logits).abs().max().item() <= 1e-5
    assert main(["inspect", "The quick brown fox", "--model", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "Top next tokens" in out and "Logit lens" in out and "final resid" in out


@pytest.mark.parametrize("hf_class", ["Gemma4ForCausalLM", "Gemma3nForCausalLM"])
def test_streamed_part_by_part_loading_equals_loading_whole(hf_class, tmp_path):
    """`device_map` converts one block at a time: the model-level per-layer table and AltUp projections belong to
    no block (their numbered lists are not the block list)."""
    from hooked import HookedTransformer

    BUILDERS[hf_class]().save_pretrained(tmp_path, safe_serialization=True)
    whole = HookedTransformer.from_pretrained_no_processing(str(tmp_path))
    streamed = HookedTransformer.from_pretrained_no_processing(str(tmp_path), device_map={"": "cpu"})
    t = torch.randint(3, VOCAB, (1, 10), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(streamed(t), whole(t))
