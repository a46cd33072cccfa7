"""ActivationReader streams rows shard by shard and shuffles them reproducibly with a seed and a bounded buffer."""

from __future__ import annotations

import pytest
import torch

from hooked.core.errors import InputError
from hooked.harvest import ActivationReader, harvest
from tests.unit.harvest._harvest_common import HOOKS, corpus_dir_fixture, model_dir_fixture, model_fixture  # noqa: F401


@pytest.fixture(scope="module", name="out")
def out_fixture(model, corpus_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("acts")
    harvest(
        model,
        corpus_dir,
        HOOKS,
        out,
        context_length=8,
        batch_size=4,
        batches_per_shard=1,
        max_tokens=480,
        progress=False,
    )
    return out


def _cat(batches) -> dict[str, torch.Tensor]:
    batches = list(batches)
    return {k: torch.cat([b[k] for b in batches]) for k in batches[0]}


def _row_ids(rows: dict[str, torch.Tensor]) -> torch.Tensor:
    return rows["context_index"] * 1000 + rows["pos_index"]


def test_streamed_batches_are_every_row_in_order(out):
    reader = ActivationReader(out)
    assert len(reader) == 480 and len(reader.shards) == 15
    batches = list(reader.batches(batch_size=50))
    assert [len(b[HOOKS[0]]) for b in batches] == [50] * 9 + [30]
    rows = _cat(batches)
    for key, value in rows.items():
        assert torch.equal(value, reader.read_all(key)), key
    assert torch.equal(_row_ids(rows), torch.arange(60).repeat_interleave(8) * 1000 + torch.arange(8).repeat(60))
    assert rows[HOOKS[1]].shape == (480, 4, 16)


def test_shuffle_is_reproducible_with_a_seed_and_a_permutation_of_the_rows(out):
    reader = ActivationReader(out)
    first = _cat(reader.batches(64, shuffle=True, seed=3, buffer_rows=100))
    again = _cat(reader.batches(64, shuffle=True, seed=3, buffer_rows=100))
    other = _cat(reader.batches(64, shuffle=True, seed=4, buffer_rows=100))
    for key in first:
        assert torch.equal(first[key], again[key]), key
    assert not torch.equal(_row_ids(first), _row_ids(other))
    order = torch.argsort(_row_ids(first))
    assert torch.equal(_row_ids(first)[order], torch.sort(_row_ids(reader.read_all_rows()))[0])
    for hook in HOOKS:  # each row keeps its own activation
        assert torch.equal(first[hook][order], reader.read_all(hook))
    # rows from several shards are mixed: the first batch does not come from a single shard
    assert first["context_index"][:64].div(4, rounding_mode="floor").unique().numel() > 1


def test_drop_last_and_bad_keys(out):
    reader = ActivationReader(out)
    assert all(len(b["tokens"]) == 100 for b in reader.batches(100, keys=["tokens"], drop_last=True))
    with pytest.raises(InputError, match="Unknown keys"):
        next(reader.batches(10, keys=["blocks.9.hook_resid_post"]))
    with pytest.raises(InputError, match="does not exist"):
        ActivationReader(out / "missing")
