"""harvest: stored rows equal run_with_cache on the same batches, bitwise; tokenization; only needed layers run."""

from __future__ import annotations

import pytest
import torch

from hooked.harvest import ActivationReader, harvest
from tests.unit.harvest._harvest_common import DOCS, HOOKS, corpus_dir_fixture, model_dir_fixture, model_fixture  # noqa: F401


def _cache_batches(model, contexts: list[torch.Tensor], batch_size: int, pad_id: int):
    """run_with_cache over `contexts` in batches of batch_size, right-padded with an attention mask like harvest."""
    for a in range(0, len(contexts), batch_size):
        rows = contexts[a : a + batch_size]
        width = max(len(r) for r in rows)
        tokens = torch.full((len(rows), width), pad_id)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            tokens[i, : len(r)], mask[i, : len(r)] = r, 1
        _, cache = model.run_with_cache(tokens, names_filter=HOOKS, attention_mask=None if mask.all() else mask)
        yield cache, mask.bool()


@pytest.mark.unchecked  # dill pickles the checked closure for the workers: beartype's wrapper cannot be pickled
def test_concat_rows_equal_run_with_cache_bitwise_and_tokens_follow_tokenize_and_concatenate(
    model, corpus_dir, tmp_path
):
    import datasets

    from hooked.compat.utils import tokenize_and_concatenate

    manifest = harvest(
        model,
        corpus_dir,
        HOOKS,
        tmp_path,
        context_length=16,
        batch_size=3,
        dtype="float16",
        batches_per_shard=2,
        progress=False,
    )
    reader = ActivationReader(tmp_path)
    assert manifest["layout"] == "contexts" and manifest["stop_at_layer"] == 1 and len(manifest["shards"]) > 2
    expected = tokenize_and_concatenate(
        datasets.Dataset.from_dict({"text": DOCS}), model.tokenizer, max_length=16, num_proc=1
    )[:]["tokens"]
    tokens = reader.read_all("tokens").reshape(-1, 16)
    assert torch.equal(tokens, expected)
    acts = {h: reader.read_all(h) for h in HOOKS}
    start = 0
    for cache, _ in _cache_batches(model, list(tokens), 3, 0):
        for h in HOOKS:
            want = cache[h].to(torch.float16).flatten(0, 1)
            assert torch.equal(acts[h][start : start + len(want)], want), h
        start += len(want)
    assert start == len(reader) == tokens.numel()
    assert reader.row_shape("blocks.0.attn.hook_z") == (model.cfg.n_heads, model.cfg.d_head)


@pytest.mark.parametrize("positions", ["all", "skip_bos", "last"])
def test_document_rows_exclude_padding_and_equal_run_with_cache_bitwise(model, corpus_dir, tmp_path, positions):
    harvest(
        model,
        corpus_dir,
        HOOKS,
        tmp_path,
        context_length=12,
        batch_size=4,
        positions=positions,
        tokenization="document",
        progress=False,
    )
    stored = {k: ActivationReader(tmp_path).read_all(k) for k in HOOKS + ["tokens", "doc_index", "pos_index"]}
    bos = model.tokenizer.eos_token_id
    contexts, doc_of = [], []
    for d, text in enumerate(DOCS):
        ids = torch.tensor(model.tokenizer(text, add_special_tokens=False)["input_ids"])
        for a in range(0, len(ids), 11):
            contexts.append(torch.cat([torch.tensor([bos]), ids[a : a + 11]]))
            doc_of.append(d)
    want = {h: [] for h in HOOKS}
    for cache, mask in _cache_batches(model, contexts, 4, model.tokenizer.eos_token_id):
        keep = mask.clone()
        if positions == "skip_bos":
            keep[:, 0] = False
        if positions == "last":
            keep = torch.zeros_like(mask)
            keep[torch.arange(len(mask)), mask.sum(1) - 1] = True
        for h in HOOKS:
            want[h].append(cache[h][keep])
    for h in HOOKS:
        assert torch.equal(stored[h], torch.cat(want[h])), h
    lengths = torch.tensor([len(c) for c in contexts])
    n_rows = {"all": lengths.sum(), "skip_bos": (lengths - 1).sum(), "last": len(contexts)}[positions]
    assert len(stored["tokens"]) == n_rows
    if positions == "last":
        assert torch.equal(stored["pos_index"], lengths - 1)
        assert torch.equal(stored["doc_index"], torch.tensor(doc_of))


def test_only_the_needed_blocks_run_and_globs_select_hooks(model, corpus_dir, tmp_path):
    calls = []
    handle = model.blocks[1].register_forward_pre_hook(lambda *_: calls.append(1))
    try:
        manifest = harvest(
            model,
            corpus_dir,
            "blocks.0.hook_*_out",
            tmp_path,
            context_length=16,
            batch_size=8,
            max_tokens=64,
            progress=False,
        )
    finally:
        handle.remove()
    assert calls == []
    assert list(manifest["hooks"]) == ["blocks.0.hook_attn_out", "blocks.0.hook_mlp_out"]
    assert manifest["stop_at_layer"] == 1 and sum(s["tokens"] for s in manifest["shards"]) == 64


def test_token_tensor_corpus_rows_of_context_length_are_used_unchanged(model, tmp_path):
    tokens = torch.randint(1, 300, (10, 8), generator=torch.Generator().manual_seed(0))
    torch.save(tokens, tmp_path / "tokens.pt")
    harvest(model, tmp_path / "tokens.pt", HOOKS[0], tmp_path / "out", context_length=8, batch_size=4, progress=False)
    reader = ActivationReader(tmp_path / "out")
    assert torch.equal(reader.read_all("tokens").reshape(10, 8), tokens)
    _, cache = model.run_with_cache(tokens[8:], names_filter=HOOKS[0])
    assert torch.equal(reader.read_all(HOOKS[0])[-16:], cache[HOOKS[0]].flatten(0, 1))


def test_bad_inputs_give_clear_errors(model, corpus_dir, tmp_path):
    from hooked.core.errors import InputError

    with pytest.raises(
        InputError,
        match=r"No hook point matches 'blocks.0.hook_resid_pots'.*Did you mean: "
        r"blocks.0.hook_resid_post",
    ):
        harvest(model, corpus_dir, "blocks.0.hook_resid_pots", tmp_path / "a", context_length=8, progress=False)
    with pytest.raises(InputError, match=r"No hook point matches 'blocks.7.\*'"):
        harvest(model, corpus_dir, "blocks.7.*", tmp_path / "a", context_length=8, progress=False)
    with pytest.raises(InputError, match=r"context_length=65 must be an int in \[2, 64\]"):
        harvest(model, corpus_dir, HOOKS, tmp_path / "a", context_length=65, progress=False)
    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(InputError, match="gives no context of 8 tokens: it is empty"):
        harvest(model, tmp_path / "empty.txt", HOOKS, tmp_path / "b", context_length=8, progress=False)
    with pytest.raises(InputError, match="does not exist"):
        harvest(model, tmp_path / "nothing", HOOKS, tmp_path / "c", context_length=8, progress=False)
    with pytest.raises(InputError, match="not a per-token activation"):
        harvest(model, corpus_dir, "blocks.0.attn.hook_pattern", tmp_path / "d", context_length=8, progress=False)


def test_cli_harvests_and_reports_errors_in_one_line(model_dir, corpus_dir, tmp_path, capsys):
    from hooked.cli import main

    argv = [
        "harvest",
        "--model",
        str(model_dir),
        "--corpus",
        str(corpus_dir),
        "--out",
        str(tmp_path / "cli"),
        "--context-length",
        "8",
        "--batch-size",
        "4",
        "--max-tokens",
        "96",
        "--dtype",
        "bfloat16",
        "--no-progress",
    ]
    assert main(argv + ["--hooks", "blocks.*.hook_resid_post"]) == 0
    reader = ActivationReader(tmp_path / "cli")
    assert reader.hooks == ["blocks.0.hook_resid_post", "blocks.1.hook_resid_post"] and len(reader) == 96
    assert reader.read_all("blocks.1.hook_resid_post").dtype == torch.bfloat16
    assert reader.manifest["model"]["id"] == str(model_dir)
    assert main(argv + ["--hooks", "blocks.0.hook_resid_pots"]) == 1
    assert "hooked: error: InputError: No hook point matches" in capsys.readouterr().err


def test_a_datasets_dataset_gives_the_same_rows_as_the_same_documents_on_disk(model, corpus_dir, tmp_path):
    import datasets

    kwargs = dict(context_length=16, batch_size=4, progress=False)
    harvest(model, corpus_dir, HOOKS[0], tmp_path / "files", **kwargs)
    harvest(model, datasets.Dataset.from_dict({"text": DOCS}), HOOKS[0], tmp_path / "dataset", **kwargs)
    files, dataset = ActivationReader(tmp_path / "files"), ActivationReader(tmp_path / "dataset")
    for key in (HOOKS[0], "tokens", "doc_index"):
        assert torch.equal(files.read_all(key), dataset.read_all(key)), key
