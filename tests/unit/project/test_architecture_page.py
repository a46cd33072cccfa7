"""docs/architecture.md describes the tree as it is: every module named, every named file real, the layers right.

Modules are named by their path from the repository root (`hooked/core/hook_points.py`); the family
converters of `loading/` may be left to docs/architectures.md (one `loading/<family>.py` row). The
page's numbered layer list must equal `LAYERS` of the import-layer test, which enforces it.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

from tests.unit.project.test_readme_layout import FAMILY_MODULES

ROOT = Path(__file__).resolve().parents[3]
PAGE = ROOT / "docs" / "architecture.md"
SOURCE_FOLDERS = ("hooked", "components", "loading")


def page_text() -> str:
    return PAGE.read_text()


def named_paths(text: str) -> set[str]:
    """Every `path/with/slashes.ext` in backticks (placeholders such as `loading/<family>.py` excluded)."""
    return {p for p in re.findall(r"`([\w./-]+/[\w.-]+\.\w+)`", text)}


def unnamed_modules(text: str) -> list[str]:
    named = named_paths(text)
    families = FAMILY_MODULES if "`loading/<family>.py`" in text else set()
    unnamed = []
    for folder in SOURCE_FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            relative = path.relative_to(ROOT).as_posix()
            family = folder == "loading" and path.parent.name == "loading" and path.stem in families
            if relative not in named and not family:
                unnamed.append(relative)
    return unnamed


def page_layers(text: str) -> list[set[str]]:
    """The layers of the numbered list under "## The layers": the backticked names that open each item."""
    section = text.split("## The layers", 1)[1].split("\n## ", 1)[0]
    items = re.findall(r"^\d+\. ((?:`[\w.]+`(?:, )?)+)", section, flags=re.M)
    return [set(re.findall(r"`([\w.]+)`", item)) for item in items]


def enforced_layers() -> list[list[str]]:
    """`LAYERS` of the import-layer test, the source of truth (it moves to tests/unit/project/ with the test tree)."""
    for name in ("tests.unit.project.test_import_layers",):
        if (ROOT / (name.replace(".", "/") + ".py")).is_file():
            return [list(layer) for layer in importlib.import_module(name).LAYERS]
    raise AssertionError("tests/unit/(project/)test_import_layers.py not found: point this test at LAYERS")


def test_every_module_is_named():
    unnamed = unnamed_modules(page_text())
    assert not unnamed, (
        "docs/architecture.md does not name these modules; add a row for each to its package's table "
        "under '## Every module' (`| `path/module.py` | what it holds |`):\n" + "\n".join(unnamed)
    )


def test_every_named_file_exists():
    stale = sorted(p for p in named_paths(page_text()) if not (ROOT / p).exists())
    assert not stale, f"docs/architecture.md names files that do not exist (renamed or moved?): {stale}"


def test_the_layer_list_is_the_enforced_one():
    assert page_layers(page_text()) == [set(layer) for layer in enforced_layers()], (
        "docs/architecture.md's numbered list under '## The layers' differs from LAYERS in "
        "test_import_layers.py: list each layer's packages, bottom first, as backticked names"
    )


def test_the_checks_see_a_stale_page():
    """The checkers themselves: a dropped row, a renamed file and a reordered layer are all seen."""
    text = page_text()
    assert unnamed_modules(text.replace("`hooked/core/errors.py`", "`errors`")) == ["hooked/core/errors.py"]
    assert "hooked/core/no_such.py" in named_paths(text + "\n`hooked/core/no_such.py`\n")
    assert unnamed_modules(text.replace("`loading/<family>.py`", "families"))[:1] == ["loading/apertus.py"]
    swapped = text.replace("1. `hooked._version`, `hooked.core`", "1. `hooked.components`", 1)
    assert page_layers(swapped) != [set(layer) for layer in enforced_layers()]


def test_the_diagrams_are_the_package_docstring_s():
    """The page's diagram is hooked/__init__.py's; README's and docs/index.md's name the layers in their order."""
    import hooked

    page_diagram = page_text().split("```text\n", 1)[1].split("```", 1)[0].strip()
    same = " ".join(page_diagram.split()) in " ".join(hooked.__doc__.split())  # the docstring indents it
    assert same, "docs/architecture.md's diagram differs from hooked/__init__.py's docstring"
    packages = [entry.rpartition(".")[2] for layer in enforced_layers() for entry in layer]
    packages = [p for p in packages if not p.startswith("_") and p != "hooked"]
    for page in (ROOT / "README.md", ROOT / "docs" / "index.md"):
        block = page.read_text().split("## How it is built\n\n```\n", 1)[1].split("```", 1)[0]
        order = re.findall(r"\b(" + "|".join(packages) + r")\b", block)
        assert list(dict.fromkeys(order)) == packages, f"{page.name}'s 'How it is built' diagram: layers out of order"
