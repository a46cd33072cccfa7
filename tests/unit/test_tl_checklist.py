"""The README's TransformerLens checklist stays true: every `hooked` path it names resolves, missing rows do not."""

import importlib
import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"
SECTION = "## TransformerLens checklist"
PATH = re.compile(r"`((?:hooked|components)\.[A-Za-z_][\w.]*)`")


def rows():
    text = README.read_text()
    assert SECTION in text, f"README.md lost its {SECTION!r} section"
    for line in text[text.index(SECTION) :].splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and line.startswith("|") and not set(cells[0]) <= {"-"}:
            for path in PATH.findall(cells[1]):
                yield path, cells[2]


def resolves(path: str) -> bool:
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            if not hasattr(obj, name):
                return False
            obj = getattr(obj, name)
        return True
    return False


ROWS = list(rows())


def test_checklist_names_many_paths():
    assert len(ROWS) > 100


@pytest.mark.parametrize("path, status", ROWS, ids=[p for p, _ in ROWS])
def test_path_matches_status(path, status):
    if status.lstrip("*").startswith("missing"):
        assert not resolves(path), f"{path} exists now: update its row in the README checklist"
    else:
        assert resolves(path), f"{path} is listed as {status.split(':')[0]!r} but does not exist"
