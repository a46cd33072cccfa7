"""The CLI reports every error as one line on stderr with exit status 1; `--debug` shows the traceback."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hooked.cli import main
from hooked.core.errors import CheckpointError
from tests.tiny_models import make_tokenizer, tiny_gpt2


@pytest.fixture(scope="module")
def small_ctx(tmp_path_factory) -> Path:
    """A tiny GPT-2 checkpoint with only 16 learned positions."""
    path = tmp_path_factory.mktemp("cli") / "ckpt"
    tiny_gpt2(n_positions=16).save_pretrained(path, safe_serialization=True)
    make_tokenizer().save_pretrained(path)
    return path


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(code: int, err: str, *needles: str) -> None:
    assert code == 1
    lines = [line for line in err.splitlines() if line.startswith("hooked: error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


def test_prompt_longer_than_the_context(capsys, small_ctx):
    long_prompt = "The quick brown fox jumps over the lazy dog. " * 6
    code, out, err = run_cli(capsys, "inspect", long_prompt, "--model", str(small_ctx))
    assert_one_line_error(code, err, "InputError", "longer than the model's context of 16")
    assert out == ""


def test_prompt_within_the_context_works(capsys, small_ctx):
    code, out, err = run_cli(capsys, "inspect", "The quick brown fox", "--model", str(small_ctx), "--top-k", "3")
    assert code == 0 and "Top next tokens" in out


def test_missing_model(capsys, tmp_path):
    code, _, err = run_cli(capsys, "inspect", "hello", "--model", str(tmp_path / "missing"))
    assert_one_line_error(code, err, "FileNotFoundError", "missing")


def test_corrupt_checkpoint(capsys, small_ctx, tmp_path):
    ckpt = Path(shutil.copytree(small_ctx, tmp_path / "ckpt"))
    (ckpt / "model.safetensors").write_bytes(b"")
    code, _, err = run_cli(capsys, "inspect", "hello", "--model", str(ckpt))
    assert_one_line_error(code, err, "CheckpointError", "model.safetensors", "0 bytes")


def test_bad_top_k(capsys, small_ctx):
    code, _, err = run_cli(capsys, "inspect", "hello", "--model", str(small_ctx), "--top-k", "0")
    assert_one_line_error(code, err, "--top-k must be >= 1, got 0")


def test_debug_shows_the_traceback(small_ctx, tmp_path):
    ckpt = Path(shutil.copytree(small_ctx, tmp_path / "ckpt"))
    (ckpt / "model.safetensors").write_bytes(b"\x00")
    with pytest.raises(CheckpointError, match="1 bytes"):
        main(["--debug", "inspect", "hello", "--model", str(ckpt)])
    with pytest.raises(CheckpointError):
        main(["inspect", "hello", "--model", str(ckpt), "--debug"])


def test_exit_status_of_the_process(tmp_path):
    """End to end: a real process exits 1 and prints no traceback."""
    result = subprocess.run(
        [sys.executable, "-m", "hooked.cli", "inspect", "hi", "--model", str(tmp_path / "nope")],
        capture_output=True, text=True, cwd=Path(__file__).resolve().parents[2], timeout=120,
    )  # fmt: skip
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("hooked: error: FileNotFoundError:")


def test_interrupt_is_quiet(capsys, monkeypatch):
    import hooked.cli as cli

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "_inspect", interrupted)
    code, _, err = run_cli(capsys, "inspect", "hello")
    assert code == 130 and err == "hooked: interrupted\n"
