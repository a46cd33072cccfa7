"""TransformerLens names and hub ids resolve through huggingface_hub, offline, from a temporary HF cache."""

from __future__ import annotations

import pytest
import torch

from hooked import HookedTransformer
from hooked.loading.model_names import OFFICIAL_MODEL_NAMES, get_official_model_name
from tests.tiny_models import NO_PROCESSING, make_tokenizer, tiny_gpt2


def place_in_hf_cache(cache, repo_id: str, hf, tokenizer, commit: str, ref: str = "main") -> None:
    """Write a checkpoint where huggingface_hub's cache layout expects `repo_id` at `ref`."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / commit
    hf.save_pretrained(snapshot)
    tokenizer.save_pretrained(snapshot)
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / ref).write_text(commit)


@pytest.fixture
def hf_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return tmp_path


def test_official_names_and_aliases():
    assert get_official_model_name("gpt2-small") == "gpt2"
    assert get_official_model_name("pythia-70m-deduped") == "EleutherAI/pythia-70m-deduped"
    assert get_official_model_name("someone/some-model") == "someone/some-model"
    assert "EleutherAI/pythia-160m" in OFFICIAL_MODEL_NAMES


def test_alias_and_hub_id_load_from_the_hf_cache_offline(hf_cache):
    tok = make_tokenizer()
    hf, hf_step = tiny_gpt2(seed=0, vocab_size=300), tiny_gpt2(seed=1, vocab_size=300)
    place_in_hf_cache(hf_cache, "gpt2", hf, tok, "a" * 40)
    place_in_hf_cache(hf_cache, "gpt2", hf_step, tok, "b" * 40, ref="step1000")
    place_in_hf_cache(hf_cache, "someone/tiny-gpt2", hf_step, tok, "c" * 40)
    tokens = torch.tensor([[1, 5, 9, 42, 7]])
    with torch.no_grad():
        expected, expected_step = hf(tokens).logits, hf_step(tokens).logits
    for name in ("gpt2-small", "gpt2"):
        model = HookedTransformer.from_pretrained(name, device="cpu", **NO_PROCESSING)
        torch.testing.assert_close(model(tokens), expected, atol=1e-5, rtol=1e-5)
    assert model.tokenizer is not None
    step = HookedTransformer.from_pretrained("gpt2-small", revision="step1000", device="cpu", **NO_PROCESSING)
    torch.testing.assert_close(step(tokens), expected_step, atol=1e-5, rtol=1e-5)
    by_id = HookedTransformer.from_pretrained("someone/tiny-gpt2", device="cpu", **NO_PROCESSING)
    torch.testing.assert_close(by_id(tokens), expected_step, atol=1e-5, rtol=1e-5)


def test_missing_hub_id_offline_names_it(hf_cache):
    with pytest.raises(FileNotFoundError, match="pythia-70m"):
        HookedTransformer.from_pretrained("pythia-70m")


@pytest.mark.parametrize("name", ["SmolLM2-135M", "HuggingFaceTB/SmolLM2-135M", "smollm2-135m-base"])
def test_a_base_name_not_available_offline_says_the_bundled_one_is_instruct(hf_cache, name):
    with pytest.raises(FileNotFoundError) as info:
        HookedTransformer.from_pretrained(name)
    message = str(info.value)
    assert f"{name!r} names the base model SmolLM2-135M, which is not bundled and was not found offline" in message
    assert "The bundled model is SmolLM2-135M-Instruct, the instruction-tuned one" in message
    assert "from_pretrained('SmolLM2-135M-Instruct') (or 'smollm2-135m')" in message


def test_a_name_not_found_offline_lists_the_bundled_models(hf_cache):
    with pytest.raises(FileNotFoundError, match=r"'gpt2' is not a local checkpoint directory.*Bundled models "
                       r"\(available offline\): SmolLM2-135M-Instruct \(also smollm2-135m, "
                       r".*gemma-3-270m"):  # fmt: skip
        HookedTransformer.from_pretrained("gpt2-small")


def test_the_cli_lists_the_bundled_models(hf_cache, capsys):
    from hooked.cli import main

    assert main(["inspect", "hi", "--model", "gpt2-small"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("hooked: error: FileNotFoundError: 'gpt2' is not a local checkpoint directory"), err
    assert "Bundled models (available offline): SmolLM2-135M-Instruct (also smollm2-135m" in err
    with pytest.raises(SystemExit):
        main(["inspect", "--help"])
    assert "bundled: SmolLM2-135M-Instruct (also smollm2-135m" in " ".join(capsys.readouterr().out.split())
