"""Pythia training checkpoints by revision (`loading/checkpoints.py`), offline, through a temporary HF cache."""

from __future__ import annotations

import pytest
import torch

from hooked.loading.checkpoints import PYTHIA_CHECKPOINTS, checkpoint_revision
from tests.tiny_models import tiny_classic

REPO = "EleutherAI/pythia-14m"


def test_checkpoint_list_is_transformerlens_s():
    assert PYTHIA_CHECKPOINTS[:12] == [0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1000]
    assert PYTHIA_CHECKPOINTS[-1] == 143000 and len(PYTHIA_CHECKPOINTS) == 154


def test_index_and_value_map_to_step_revisions():
    assert checkpoint_revision("pythia-70m", checkpoint_index=0) == "step0"
    assert checkpoint_revision("EleutherAI/pythia-70m-deduped", checkpoint_index=11) == "step1000"
    assert checkpoint_revision("EleutherAI/pythia-70m", checkpoint_index=-1) == "step143000"
    assert checkpoint_revision("EleutherAI/pythia-70m", checkpoint_value=512) == "step512"
    assert checkpoint_revision("EleutherAI/pythia-70m") is None


@pytest.mark.parametrize(
    "name, kwargs, message",
    [
        ("pythia-70m", dict(checkpoint_value=1500), "no checkpoint at step 1500"),
        ("pythia-70m", dict(checkpoint_index=154), "out of range"),
        ("pythia-70m", dict(checkpoint_index=1, checkpoint_value=1), "not both"),
        ("gpt2", dict(checkpoint_index=3), "Pythia models"),
    ],
)
def test_bad_checkpoint_requests_raise_clearly(name, kwargs, message):
    with pytest.raises(ValueError, match=message):
        checkpoint_revision(name, **kwargs)


def write_cached_revision(cache, hf, revision: str, commit: str) -> None:
    """What huggingface_hub leaves after downloading `revision`: refs/<revision> -> snapshots/<commit>/."""
    repo = cache / f"models--{REPO.replace('/', '--')}"
    hf.save_pretrained(repo / "snapshots" / commit, safe_serialization=True)
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / revision).write_text(commit)


@pytest.fixture(params=["HF_HUB_CACHE", "HF_HOME"])
def offline_cache(request, tmp_path, monkeypatch):
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv(request.param, str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cache = tmp_path if request.param == "HF_HUB_CACHE" else tmp_path / "hub"
    early, late = tiny_classic("neox_parallel_rot025", seed=1), tiny_classic("neox_parallel_rot025", seed=2)
    write_cached_revision(cache, early, "step1000", "a" * 40)
    write_cached_revision(cache, late, "step143000", "b" * 40)
    return early, late


def test_loads_the_cached_revision_offline(offline_cache):
    from hooked import HookedTransformer

    early, late = offline_cache
    t = torch.randint(3, 97, (1, 9), generator=torch.Generator().manual_seed(0))
    for kwargs, hf in ((dict(checkpoint_value=1000), early), (dict(checkpoint_index=-1), late)):
        model = HookedTransformer.from_pretrained_no_processing(REPO, **kwargs)
        with torch.no_grad():
            assert (model(t) - hf(t).logits).abs().max() <= 1e-5
    model = HookedTransformer.from_pretrained("pythia-14m", checkpoint_label=1000)  # a TransformerLens name
    cfg = model.cfg
    assert (cfg.from_checkpoint, cfg.checkpoint_index, cfg.checkpoint_value, cfg.checkpoint_label_type) == (
        True, 11, 1000, "step",
    )  # fmt: skip


def test_a_missing_revision_names_itself_and_the_cached_ones(offline_cache):
    from hooked import HookedTransformer

    with pytest.raises(FileNotFoundError, match="'step2000'.*cached revisions: step1000, step143000") as err:
        HookedTransformer.from_pretrained(REPO, checkpoint_value=2000)
    assert "HF_HUB_OFFLINE" in str(err.value)
