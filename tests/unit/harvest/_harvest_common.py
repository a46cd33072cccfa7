"""Shared pieces of the harvest tests: a tiny GPT-2 saved to disk (so subprocesses load it by path) and a corpus."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.tiny_models import CORPUS

REPO = Path(__file__).resolve().parents[3]
WORKER = Path(__file__).with_name("_harvest_worker.py")
HOOKS = ["blocks.0.hook_resid_post", "blocks.0.attn.hook_z"]
DOCS = [f"{i}: {CORPUS[i % len(CORPUS)]} {CORPUS[(3 * i + 1) % len(CORPUS)][: 5 + 7 * (i % 5)]}" for i in range(60)]


@pytest.fixture(scope="module", name="model_dir")
def model_dir_fixture(tmp_path_factory) -> Path:
    from tests.tiny_models import make_tokenizer, tiny_gpt2

    path = tmp_path_factory.mktemp("tiny-gpt2")
    tokenizer = make_tokenizer()
    hf = tiny_gpt2(vocab_size=300, n_positions=64, bos_token_id=0, eos_token_id=0)
    hf.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module", name="model")
def model_fixture(model_dir):
    from hooked import HookedTransformer

    return HookedTransformer.from_pretrained(str(model_dir), device="cpu")


@pytest.fixture(scope="module", name="corpus_dir")
def corpus_dir_fixture(tmp_path_factory) -> Path:
    """Two text files and a JSONL file (read in sorted name order)."""
    path = tmp_path_factory.mktemp("corpus")
    (path / "a.txt").write_text(DOCS[0])
    (path / "b.jsonl").write_text("\n".join(json.dumps({"text": d}) for d in DOCS[1:-1]) + "\n")
    (path / "c.txt").write_text(DOCS[-1])
    return path


def worker_cmd(model_dir: Path, corpus: Path, out: Path, **kwargs) -> list[str]:
    return [sys.executable, str(WORKER), str(model_dir), str(corpus), str(out), json.dumps(kwargs)]


def worker_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    return env | dict(PYTHONPATH=str(REPO), OMP_NUM_THREADS="1") | {k: str(v) for k, v in extra.items()}


def run_worker(model_dir, corpus, out, timeout: float = 120, **kwargs) -> None:
    done = subprocess.run(
        worker_cmd(model_dir, corpus, out, **kwargs), env=worker_env(), timeout=timeout, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def read_everything(out: Path) -> dict[str, torch.Tensor]:
    """Every stored key of a harvest, rows in order."""
    from hooked.harvest import ActivationReader

    reader = ActivationReader(out)
    return {k: reader.read_all(k) for k in reader.hooks + ["tokens", "doc_index", "pos_index", "context_index"]}


def assert_same_harvest(a: Path, b: Path) -> None:
    left, right = read_everything(a), read_everything(b)
    assert left.keys() == right.keys()
    for key in left:
        assert torch.equal(left[key], right[key]), key
