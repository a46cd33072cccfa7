"""Default shard size (small enough that a kill loses little), the progress total, Ctrl-C's message, --help."""

from __future__ import annotations

import importlib
import json
import signal
import subprocess
import sys
import time

import pytest
import torch

from hooked.cli import main
from hooked.harvest import ActivationReader, HarvestInterrupted, harvest, writer
from hooked.harvest.harvest import MIN_SHARD_BYTES, SHARD_BYTES, SHARDS_PER_HARVEST, default_batches_per_shard
from tests.unit.harvest._harvest_common import (  # noqa: F401  (fixtures)
    HOOKS,
    assert_same_harvest,
    corpus_dir_fixture,
    model_dir_fixture,
    model_fixture,
    worker_env,
)

harvest_module = importlib.import_module("hooked.harvest.harvest")  # the package's `harvest` is the function
harvest_fn = harvest


def test_default_shards_are_a_twentieth_of_a_known_harvest_within_bounds():
    shapes = {"blocks.10.hook_resid_post": (576,)}  # SmolLM2-135M, float32, 128-token contexts, batch 8
    batch_bytes = 576 * 4 * 128 * 8
    n_batches = -(-50_000 // (128 * 8))  # the 50k-token harvest: 49 batches
    bps = default_batches_per_shard(shapes, torch.float32, 128, 8, n_batches)
    assert bps == -(-n_batches // SHARDS_PER_HARVEST)  # 3 batches, ~7 MB: a kill redoes at most 3 of 49 batches
    assert MIN_SHARD_BYTES <= bps * batch_bytes <= SHARD_BYTES
    # unknown size: the largest default shard, not more
    most = default_batches_per_shard(shapes, torch.float32, 128, 8, None)
    assert most * batch_bytes <= SHARD_BYTES < (most + 1) * batch_bytes
    # a huge harvest is capped at SHARD_BYTES; a tiny one is not cut into files smaller than MIN_SHARD_BYTES
    assert default_batches_per_shard(shapes, torch.float32, 128, 8, 10**6) == most
    tiny = default_batches_per_shard(shapes, torch.float32, 128, 2, 2)  # batches of 2 contexts: 0.56 MB
    assert tiny == MIN_SHARD_BYTES // (batch_bytes // 4) == 7


@pytest.mark.slow
def test_harvest_of_known_size_defaults_to_about_twenty_shards_and_the_bar_has_its_total(
    model, corpus_dir, tmp_path, monkeypatch, capsys
):
    monkeypatch.setattr(harvest_module, "MIN_SHARD_BYTES", 1)  # the tiny model's shards would be one file otherwise
    manifest = harvest_fn(model, corpus_dir, HOOKS, tmp_path / "a", context_length=8, batch_size=2)
    n_batches = -(-len(ActivationReader(tmp_path / "a").read_all("tokens")) // 8 // 2)
    bps = manifest["identity"]["batches_per_shard"]
    assert bps == -(-n_batches // SHARDS_PER_HARVEST) and n_batches > 2 * SHARDS_PER_HARVEST
    assert SHARDS_PER_HARVEST - bps < len(manifest["shards"]) <= SHARDS_PER_HARVEST
    tokens = sum(s["tokens"] for s in manifest["shards"])
    bar = capsys.readouterr().err.replace("\r", "\n").splitlines()[-1]
    assert "100%" in bar, bar  # a total, so a percentage and an ETA
    assert f"{tokens / 1000:.2f}k/{tokens / 1000:.2f}k" in bar or f"{tokens}/{tokens}" in bar, bar


def test_max_tokens_sizes_the_shards_without_tokenizing_a_large_corpus(model, corpus_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(harvest_module, "MIN_SHARD_BYTES", 1)
    monkeypatch.setattr(harvest_module, "PLAN_LIMIT_TOKENS", 20)  # the corpus counts as too large to count
    manifest = harvest_fn(
        model, corpus_dir, HOOKS, tmp_path, context_length=8, batch_size=2, max_tokens=640, progress=False
    )
    assert manifest["identity"]["batches_per_shard"] == -(-640 // 16 // SHARDS_PER_HARVEST)
    assert sum(s["tokens"] for s in manifest["shards"]) == 640


def test_a_resumed_harvest_keeps_the_shard_size_it_started_with(model, corpus_dir, tmp_path, monkeypatch):
    old = harvest_fn(
        model,
        corpus_dir,
        HOOKS,
        tmp_path,
        context_length=8,
        batch_size=2,
        max_tokens=320,
        batches_per_shard=7,
        progress=False,
    )
    (tmp_path / old["shards"][-1]["file"]).unlink()  # as if the run had been killed before its last shard
    manifest = json.loads((tmp_path / writer.MANIFEST).read_text())
    manifest["shards"], manifest["complete"] = manifest["shards"][:-1], False
    (tmp_path / writer.MANIFEST).write_text(json.dumps(manifest))
    resumed = harvest_fn(
        model, corpus_dir, HOOKS, tmp_path, context_length=8, batch_size=2, max_tokens=320, progress=False
    )  # no batches_per_shard: the stored 7, not today's default
    assert resumed["identity"]["batches_per_shard"] == 7 and resumed["complete"]
    assert [s["rows"] for s in resumed["shards"]] == [s["rows"] for s in old["shards"]]


def _cli_args(model_dir, corpus_dir, out) -> list[str]:
    return [
        "harvest",
        "--model",
        str(model_dir),
        "--corpus",
        str(corpus_dir),
        "--out",
        str(out),
        "--hooks",
        ",".join(HOOKS),
        "--context-length",
        "8",
        "--batch-size",
        "2",
        "--batches-per-shard",
        "1",
        "--max-tokens",
        "256",
        "--no-progress",
    ]


def test_ctrl_c_says_how_many_shards_were_kept_and_rerunning_resumes(
    model_dir, corpus_dir, tmp_path, monkeypatch, capsys
):
    assert main(_cli_args(model_dir, corpus_dir, tmp_path / "full")) == 0
    forward, calls = harvest_module._forward, []

    def interrupted_at_batch_6(*args, **kwargs):
        calls.append(1)
        if len(calls) == 6:
            raise KeyboardInterrupt  # what Ctrl-C raises in the main thread
        return forward(*args, **kwargs)

    monkeypatch.setattr(harvest_module, "_forward", interrupted_at_batch_6)
    out = tmp_path / "out"
    capsys.readouterr()
    assert main(_cli_args(model_dir, corpus_dir, out)) == 130
    err = capsys.readouterr().err.strip().splitlines()[-1]
    kept = ActivationReader(out).shards
    assert len(kept) == 4  # shards (= batches) 0-3 written; batch 4 computed but not yet on the host, 5 interrupted
    tokens = sum(s["tokens"] for s in kept)
    assert err == (
        f"hooked: interrupted: 4 complete shards ({tokens} of "
        f"{sum(s['tokens'] for s in ActivationReader(tmp_path / 'full').shards)} tokens) are kept in {out}; "
        f"rerun the same command to resume from there"
    ), err
    monkeypatch.setattr(harvest_module, "_forward", forward)
    assert main(_cli_args(model_dir, corpus_dir, out)) == 0
    assert_same_harvest(tmp_path / "full", out)


def test_harvest_interrupted_is_a_keyboard_interrupt():
    assert issubclass(HarvestInterrupted, KeyboardInterrupt) and not issubclass(HarvestInterrupted, Exception)


@pytest.mark.slow
def test_a_real_sigint_to_the_cli_keeps_the_shards_and_says_so(model_dir, corpus_dir, tmp_path):
    # 256 tokens are 16 shards, harvested in milliseconds: the whole run could end between the second
    # shard and the signal, so this run reads 40 copies of the corpus with no token limit (640 shards)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for copy in range(40):
        for f in sorted(corpus_dir.iterdir()):
            (corpus / f"{copy:02d}_{f.name}").write_text(f.read_text())
    out = tmp_path / "out"
    args = _cli_args(model_dir, corpus, out)
    limit = args.index("--max-tokens")
    del args[limit : limit + 2]
    proc = subprocess.Popen(
        [sys.executable, "-m", "hooked.cli"] + args,
        # a pytest-xdist worker ignores SIGINT, and an ignored signal stays ignored in its children:
        # give the CLI the default disposition a terminal's Ctrl-C meets
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        env=worker_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    start = time.monotonic()
    manifest = out / writer.MANIFEST
    while not (manifest.exists() and len(json.loads(manifest.read_text())["shards"]) >= 2):
        assert proc.poll() is None and time.monotonic() - start < 120, "the harvest made no progress"
        time.sleep(0.005)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    kept = len(ActivationReader(out).shards)
    assert proc.returncode == 130 and f"hooked: interrupted: {kept} complete shards" in err, err
    assert "rerun the same command to resume" in err


def test_help_shows_defaults_and_what_a_txt_corpus_is(capsys):
    with pytest.raises(SystemExit):
        main(["harvest", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for shown in (
        "contexts per forward pass (default: 8)",
        "(default: float32)",
        "(default: all)",
        "(default: concat)",
        "a .txt file (one document: the whole file)",
        "one document per line",
        "a kill loses about 1/20 of the harvest (plus the batch in flight)",
        "Rerunning the same command resumes",
    ):
        assert shown in text, shown
    assert "(default: None)" not in text
