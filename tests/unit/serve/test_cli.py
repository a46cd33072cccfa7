"""`hooked serve`'s command line: every option shows its default, sizes parse, options reach the server."""

from __future__ import annotations

import argparse
import re

import pytest

from hooked.cli import _serve_options, _size, main


def test_help_shows_every_default(capsys):
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    text = capsys.readouterr().out
    options = set(re.findall(r"^  (--[a-z-]+)", text, flags=re.M)) - {"--help"}
    assert len(options) > 20
    # argparse wraps long lines: one option's entry runs until the next option's
    entries = re.split(r"\n  (?=--)", text.split("options:", 1)[1])
    missing = [e.split()[0] for e in entries if e.strip().startswith("--") and "(default:" not in e]
    assert not missing, missing
    assert "16+ characters" in text and "(default: auto)" in text


def test_sizes_and_options():
    assert _size("512M") == 512 * 2**20 and _size("1.5G") == 3 * 2**29 and _size("65536") == 65536
    assert _size("auto") is None and _size("2GiB") == 2**31
    with pytest.raises(argparse.ArgumentTypeError):
        _size("lots")
    parser = argparse.ArgumentParser()
    from hooked.cli import _add_serve_limits

    _add_serve_limits(parser)
    args = parser.parse_args(["--max-request-memory", "2G", "--header-timeout", "3", "--drain-timeout", "5"])
    options = _serve_options(args)
    assert options.limits.max_request_memory == 2**31 and options.limits.max_answer_bytes is None
    assert options.connections.header_timeout_s == 3 and options.drain_timeout_s == 5
