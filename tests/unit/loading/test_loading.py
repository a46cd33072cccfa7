"""loading/: pure converters, the registry's errors, local checkpoints, tied embeddings."""

import pytest
import torch

from hooked import HookedTransformer
from hooked.loading import get_architecture, supported_architectures
from tests.tiny_models import NO_PROCESSING, hooked_from, tiny_gpt2


def test_unsupported_architecture_lists_supported():
    with pytest.raises(NotImplementedError, match="GPT2LMHeadModel"):
        get_architecture("XLNetLMHeadModel")


@pytest.mark.parametrize(
    "hf_class, model_class",
    [
        ("BertForMaskedLM", "HookedEncoder"),
        ("T5ForConditionalGeneration", "HookedEncoderDecoder"),
        ("HubertModel", "HookedAudioEncoder"),
    ],
)
def test_non_decoder_architecture_names_the_class_that_loads_it(hf_class, model_class):
    with pytest.raises(
        NotImplementedError, match=rf"not a decoder-only model: load it with hooked\.{model_class}\.from_pretrained"
    ):
        get_architecture(hf_class)


def test_gpt2_converter_is_pure_on_a_plain_dict():
    hf = tiny_gpt2()
    arch = get_architecture("GPT2LMHeadModel")
    from hooked import HookedTransformerConfig

    cfg = HookedTransformerConfig.from_dict(arch.config(hf.config))
    state = {k: v.detach().clone() for k, v in hf.state_dict().items()}
    state.pop("lm_head.weight")
    sd = arch.weights(state, cfg)
    assert sd["blocks.1.attn.W_Q"].shape == (4, 64, 16) and sd["blocks.1.attn.W_O"].shape == (4, 16, 64)
    assert sd["unembed.W_U"].data_ptr() == sd["embed.W_E"].data_ptr()  # tied: a view, not a copy
    w = state["transformer.h.1.attn.c_attn.weight"]
    torch.testing.assert_close(sd["blocks.1.attn.W_K"][2], w[:, 64 + 32 : 64 + 48], atol=0, rtol=0)


def test_local_safetensors_directory_matches_in_memory_model(tmp_path):
    hf = tiny_gpt2(seed=3)
    hf.save_pretrained(tmp_path)
    from_dir = HookedTransformer.from_pretrained(str(tmp_path), **NO_PROCESSING)
    from_mem = hooked_from(hf)
    t = torch.randint(0, 1000, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(from_dir(t), from_mem(t), atol=0, rtol=0)
        torch.testing.assert_close(from_dir(t), hf(t).logits, atol=1e-5, rtol=0)
    assert from_dir.embeddings_tied() and from_mem.embeddings_tied()


def test_hf_model_is_not_written_through():
    hf = tiny_gpt2(seed=4)
    before = hf.transformer.h[0].attn.c_attn.weight.detach().clone()
    model = hooked_from(hf)
    with torch.no_grad():
        model.blocks[0].attn.W_Q.zero_()
    torch.testing.assert_close(hf.transformer.h[0].attn.c_attn.weight, before, atol=0, rtol=0)


def test_missing_checkpoint_has_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="local checkpoint directory"):
        HookedTransformer.from_pretrained(str(tmp_path / "nope"))
    assert "GPT2LMHeadModel" in supported_architectures()
