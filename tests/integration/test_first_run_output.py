"""What a first-time user sees: `hooked inspect` converting the bundled model prints one line, loading one more.

A fresh `HOOKED_CACHE_DIR` forces the conversion of the bundled SmolLM2 GGUF (tens of seconds).
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

PROMPT = "The Eiffel Tower is in the city of"
LOADED = "Loaded smollm2-135m (SmolLM2-135M-Instruct, bundled) into HookedTransformer"


def _inspect(cache_dir, *extra: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, HOOKED_CACHE_DIR=str(cache_dir))
    cmd = [sys.executable, "-m", "hooked.cli", "inspect", PROMPT, *extra]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)


def test_a_conversion_is_one_line_and_a_load_another(tmp_path):
    first = _inspect(tmp_path)
    assert first.returncode == 0, first.stderr
    assert "\r" not in first.stderr, first.stderr  # no progress bars
    target = tmp_path / "smollm2-135m"
    assert first.stderr.splitlines() == [
        f"Converting SmolLM2-135M-Instruct.Q4_1.gguf into a float32 checkpoint at {target} "
        "(once per cache; tens of seconds)",
        LOADED,
    ], first.stderr
    assert "Top next tokens:" in first.stdout and "' Paris'" in first.stdout
    again = _inspect(tmp_path)
    assert again.returncode == 0 and again.stderr.splitlines() == [LOADED], again.stderr


def test_the_bundled_model_is_named_for_what_it_is(caplog):
    from hooked import HookedTransformer

    with caplog.at_level(logging.DEBUG):
        model = HookedTransformer.from_pretrained("smollm2-135m")
    assert model.cfg.model_name == "SmolLM2-135M-Instruct"
    info = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
    assert LOADED in info, info
    untie = [r for r in caplog.records if "the embeddings are untied" in r.getMessage()]
    assert untie and all(r.levelno == logging.DEBUG for r in untie)  # expected after fold_ln: not a warning
