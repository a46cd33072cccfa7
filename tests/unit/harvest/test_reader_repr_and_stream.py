"""ActivationReader's repr says what a harvest holds; `stream` is an endless data_provider of full batches."""

from __future__ import annotations

import pytest
import torch

from hooked.core.errors import InputError
from hooked.harvest import ActivationReader, harvest
from tests.unit.harvest._harvest_common import HOOKS, corpus_dir_fixture, model_dir_fixture, model_fixture  # noqa: F401


@pytest.fixture(scope="module")
def out(model, corpus_dir, tmp_path_factory):
    path = tmp_path_factory.mktemp("acts")
    harvest(
        model,
        corpus_dir,
        HOOKS,
        path,
        context_length=8,
        batch_size=2,
        max_tokens=160,
        batches_per_shard=3,
        dtype="float16",
        progress=False,
    )
    return path


def test_repr_names_rows_shards_hooks_shapes_and_dtype(out, model):
    reader = ActivationReader(out)
    text = repr(reader)
    d, h, dh = model.cfg.d_model, model.cfg.n_heads, model.cfg.d_head
    assert text.startswith(f"ActivationReader('{out}': {len(reader)} rows in {len(reader.shards)} shards (complete)")
    assert len(reader) == 160 and len(reader.shards) == 4
    assert f"blocks.0.hook_resid_post [{d}]" in text and f"blocks.0.attn.hook_z [{h}, {dh}]" in text
    assert "float16" in text and "context_length 8" in text and "concat tokenization" in text
    assert reader.dtype == torch.float16 == reader.read_all(HOOKS[0]).dtype


def test_stream_cycles_epochs_with_full_float32_batches(out):
    reader = ActivationReader(out)
    stream = reader.stream(HOOKS[0], batch_size=48, seed=3)
    batches = [next(stream) for _ in range(7)]  # 160 rows: 3 full batches per epoch, then the next epoch
    assert all(b.shape == (48, reader.row_shape(HOOKS[0])[0]) and b.dtype == torch.float32 for b in batches)
    rows = reader.read_all(HOOKS[0]).float()
    epoch = torch.cat(batches[:3])
    # each epoch's rows are distinct rows of the harvest, shuffled (not in stored order)
    matches = (epoch[:, None, :] == rows[None, :, :]).all(-1)  # [144, 160]
    assert (matches.sum(1) >= 1).all() and not torch.equal(epoch, rows[:144])
    assert not torch.equal(torch.cat(batches[3:6]), epoch)  # epoch 1 is shuffled with another seed
    again = reader.stream(HOOKS[0], batch_size=48, seed=3)
    assert all(torch.equal(next(again), b) for b in batches)
    as_stored = next(reader.stream(HOOKS[0], batch_size=48, shuffle=False, dtype=None))
    assert as_stored.dtype == torch.float16 and torch.equal(as_stored, rows[:48].half())


def test_stream_bad_arguments(out):
    reader = ActivationReader(out)
    with pytest.raises(InputError, match="Unknown hook"):
        next(reader.stream("blocks.9.hook_resid_post"))
    with pytest.raises(InputError, match="more than the harvest's 160 rows"):
        next(reader.stream(HOOKS[0], batch_size=1000))
