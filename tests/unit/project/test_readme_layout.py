"""README.md's "What is where" table has a row for every folder a reader meets.

Required rows: every top-level folder of the repository, every subpackage of `hooked/` and every
folder of `tests/`, each as `| \\`path/\\` | contents |`. Folders are those holding files git tracks or
would track (`git ls-files --cached --others --exclude-standard`), so local scratch folders and build
outputs never count. A new folder from another branch (`hooked/serve/`, `hooked/remote/`, ...) fails
this test until its row is added.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
SECTION = "## What is where"


def table_paths() -> list[str]:
    text = (ROOT / "README.md").read_text()
    assert SECTION in text, f"README.md lost its {SECTION!r} section"
    section = text[text.index(SECTION) :].split("\n## ", 1)[0]
    return [m.group(1) for m in re.finditer(r"^\| `([^`]+)` \|", section, flags=re.M)]


def repository_files() -> list[str]:
    try:
        listing = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT, capture_output=True, text=True, timeout=60, check=True,
        ).stdout  # fmt: skip
    except (OSError, subprocess.CalledProcessError) as error:
        pytest.skip(f"not a git checkout ({error}): the folder list comes from git")
    return [line for line in listing.splitlines() if (ROOT / line).exists()]


def required_folders() -> set[str]:
    folders = set()
    for path in repository_files():
        parts = Path(path).parts
        if len(parts) < 2:
            continue
        folders.add(parts[0] + "/")
        if (
            parts[0] in ("hooked", "tests")
            and len(parts) >= 3
            and "__pycache__" not in parts
            and (parts[0] == "tests" or (ROOT / parts[0] / parts[1] / "__init__.py").exists())
        ):
            folders.add(f"{parts[0]}/{parts[1]}/")
    return folders


def test_every_folder_has_a_row():
    rows = set(table_paths())
    missing = sorted(required_folders() - rows)
    assert not missing, (
        "README.md's 'What is where' table has no row for "
        + ", ".join(f"`{folder}`" for folder in missing)
        + ". Add one row each, below the rows of its parent folder, e.g.\n"
        + "\n".join(f"| `{folder}` | <what it holds, in a sentence; link its docs/ page> |" for folder in missing)
    )


def test_every_row_names_a_folder_that_exists():
    stale = [path for path in table_paths() if not (ROOT / path).is_dir()]
    assert not stale, f"README.md's 'What is where' table lists folders that do not exist: {stale}"


def table_rows() -> dict[str, str]:
    text = (ROOT / "README.md").read_text()
    section = text[text.index(SECTION) :].split("\n## ", 1)[0]
    return {m.group(1): m.group(2) for m in re.finditer(r"^\| `([^`]+)` \| (.*) \|$", section, flags=re.M)}


def test_every_file_a_row_names_exists():
    """A row's `name.py` (or `name.sh`, ...) is a file of that folder: renames show up here."""
    stale = []
    for folder, contents in table_rows().items():
        for name in re.findall(r"`([\w./-]+\.(?:py|sh))`", contents):
            if not (ROOT / folder / name).is_file():
                stale.append(f"{folder}{name}")
    assert not stale, f"README.md's 'What is where' table names files that do not exist: {stale}"


def test_every_python_file_of_the_package_is_named():
    """Each module of the model's layers appears in its folder's row (family converters excepted).

    The feature folders above them (circuits, harvest, viz, scale, serve, remote, compat) are
    described in a sentence here and file by file in docs/architecture.md.
    """
    rows = table_rows()
    unnamed = []
    for folder in ENUMERATED_FOLDERS:
        for path in sorted((ROOT / folder).glob("*.py")):
            named = f"`{path.name}`" in rows[folder] or path.name == "__init__.py"
            family = folder == "loading/" and path.stem in FAMILY_MODULES
            if not (named or family):
                unnamed.append(f"{folder}{path.name}")
    assert not unnamed, f"README.md's 'What is where' table does not name: {unnamed}"


def _family_modules() -> set[str]:
    """The loading/ modules that hold a family's converter (they are listed in docs/architectures.md)."""
    import hooked.loading  # noqa: F401  (registers every converter)
    from hooked.loading.registry import ARCHITECTURES, MODEL_CLASS_ARCHITECTURES

    archs = [*ARCHITECTURES.values(), *(arch for _, arch in MODEL_CLASS_ARCHITECTURES.values())]
    return {arch.config.__module__.rpartition(".")[2] for arch in archs} | {
        arch.weights.__module__.rpartition(".")[2] for arch in archs
    }


FAMILY_MODULES = _family_modules()
ENUMERATED_FOLDERS = (
    "hooked/",
    "hooked/core/",
    "components/",
    "hooked/processing/",
    "hooked/placement/",
    "loading/",
    "hooked/analysis/",
    "hooked/generation/",
    "hooked/models/",
)


def test_readme_stays_a_guide():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines: move reference material into a docs/ page"
