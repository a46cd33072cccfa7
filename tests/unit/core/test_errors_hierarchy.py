"""One error hierarchy: every exception class of the library lives in `hooked.core.errors` under `HookedError`.

A class defined anywhere else would escape `except HookedError` and the documented tree, so
the source is scanned (no import needed) for classes deriving from `Exception`.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import inspect
import re
from pathlib import Path

import pytest

import hooked.core.errors as errors
from hooked.core.errors import HookedError

REPO = Path(__file__).resolve().parents[3]
SCANNED = ("hooked", "components", "loading")
ERRORS_FILE = Path("hooked/core/errors.py")
# Not an error: Ctrl-C during a harvest stays a `KeyboardInterrupt`, which `except Exception` must not catch.
NOT_EXCEPTIONS = {"HarvestInterrupted"}

# Classes that used to be defined elsewhere: (old module, name, built-in base callers catch).
MOVED = [
    ("hooked.core.utils", "MissingStepsError", RuntimeError),
    ("hooked.compat.utils", "MissingStepsError", RuntimeError),
    ("hooked.loading.bundled", "BundledModelNotInstalledError", ModuleNotFoundError),
    ("hooked.scale.collectives", "PipelineError", RuntimeError),
    ("hooked.harvest.writer", "HarvestWriteError", OSError),
    ("hooked.harvest.writer", "HarvestMismatchError", ValueError),
    ("hooked.core.factored_matrix", "LeadingDimsMismatchError", RuntimeError),
    ("hooked.factored_matrix", "LeadingDimsMismatchError", RuntimeError),
    ("hooked.serve.wire", "WireError", ValueError),
    ("hooked.serve.scheduler", "WireError", ValueError),
    ("hooked.serve.scheduler", "JobCancelled", ValueError),
    ("hooked.serve.scheduler", "JobTimeout", ValueError),
]


def _exception_classes_in_source(roots=SCANNED, base=REPO) -> dict[str, list[str]]:
    """`{class name: ["file:line", ...]}` for every class that derives, directly or not, from `Exception`.

    Bases are matched by their last dotted name, so `errors.InputError` counts; a base from
    another package counts when its name ends in Error/Exception/Warning.
    """
    defs: dict[str, list[tuple[str, list[str]]]] = {}
    for root in roots:
        for path in sorted((base / root).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            for node in ast.walk(tree):
                if isinstance(node, ast.ClassDef):
                    names = [ast.unparse(b).split("[")[0].split(".")[-1] for b in node.bases]
                    where = f"{path.relative_to(base)}:{node.lineno}"
                    defs.setdefault(node.name, []).append((where, names))
    known = {name for name, obj in vars(builtins).items() if isinstance(obj, type) and issubclass(obj, Exception)}
    found: set[str] = set()
    changed = True
    while changed:
        changed = False
        for name, entries in defs.items():
            if name in found:
                continue
            for _, bases in entries:
                if any(b in known or b in found or re.search(r"(Error|Exception|Warning)$", b) for b in bases):
                    found.add(name)
                    changed = True
                    break
    return {name: [where for where, _ in defs[name]] for name in sorted(found)}


def test_every_exception_class_is_defined_in_errors_module():
    stray = [
        where
        for name, places in _exception_classes_in_source().items()
        for where in places
        if Path(where.split(":")[0]) != ERRORS_FILE and name not in NOT_EXCEPTIONS
    ]
    assert not stray, (
        f"exception classes defined outside {ERRORS_FILE}: {stray}; move each into {ERRORS_FILE} "
        "(subclassing HookedError and the built-in it derives from) and import it where it was defined"
    )


def test_the_scan_finds_a_stray_class(tmp_path):
    """The scan above must be able to fail: a planted class (direct or indirect) is reported with its line."""
    pkg = tmp_path / "hooked" / "viz"
    pkg.mkdir(parents=True)
    (pkg / "stray.py").write_text(
        "from hooked.core import errors\n\n"
        "class Direct(ValueError):\n    pass\n\n"
        "class Indirect(Direct):\n    pass\n\n"
        "class FromLibrary(errors.InputError):\n    pass\n\n"
        "class NotAnError:\n    pass\n",
        encoding="utf-8",
    )
    found = _exception_classes_in_source(roots=("hooked",), base=tmp_path)
    assert found == {
        "Direct": ["hooked/viz/stray.py:3"],
        "Indirect": ["hooked/viz/stray.py:6"],
        "FromLibrary": ["hooked/viz/stray.py:9"],
    }


def _error_classes() -> dict[str, type]:
    return {
        name: obj
        for name, obj in vars(errors).items()
        if inspect.isclass(obj) and issubclass(obj, BaseException) and obj.__module__ == errors.__name__
    }


def test_every_class_in_errors_is_a_hooked_error():
    classes = _error_classes()
    assert len(classes) > 20
    outside = sorted(name for name, cls in classes.items() if not issubclass(cls, HookedError))
    assert not outside, f"{outside} in hooked.core.errors do not derive from HookedError"
    assert sorted(errors.__all__) == sorted(classes), "hooked.core.errors.__all__ must list exactly its classes"


def test_errors_module_imports_nothing_from_hooked():
    tree = ast.parse((REPO / ERRORS_FILE).read_text(encoding="utf-8"))
    imported = [
        alias.name if isinstance(node, ast.Import) else node.module or ""
        for node in ast.walk(tree)
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for alias in node.names
    ]
    assert [m for m in imported if m != "__future__"] == []


@pytest.mark.filterwarnings("ignore:`hooked.factored_matrix` is an old module path:DeprecationWarning")  # on purpose
@pytest.mark.parametrize(("module", "name", "builtin"), MOVED, ids=[f"{m}.{n}" for m, n, _ in MOVED])
def test_moved_class_keeps_its_old_import_path_and_builtin_base(module, name, builtin):
    cls = getattr(importlib.import_module(module), name)
    assert cls is getattr(errors, name)
    assert issubclass(cls, HookedError) and issubclass(cls, builtin)


def _parse_tree(text: str) -> dict[str, tuple[str | None, set[str]]]:
    """`{name: (parent, built-in bases shown)}` from a box-drawing tree whose root line is `HookedError`."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "HookedError")
    column = lines[start].index("HookedError")
    nodes: dict[str, tuple[str | None, set[str]]] = {"HookedError": (None, set())}
    stack = ["HookedError"]
    for line in lines[start + 1 :]:
        match = re.match(r"^([ │]*)[├└]── (\w+)(?: \(([\w, ]+)\))?", line)
        if not match:
            break
        depth = (len(match.group(1)) - column) // 4 + 1
        name = match.group(2)
        del stack[depth:]
        nodes[name] = (stack[-1], {b.strip() for b in (match.group(3) or "").split(",") if b.strip()})
        stack.append(name)
    return nodes


def _actual_tree() -> dict[str, tuple[str | None, set[str]]]:
    tree = {}
    for name, cls in _error_classes().items():
        if cls is HookedError:
            tree[name] = (None, set())
            continue
        hooked_bases = [b for b in cls.__bases__ if issubclass(b, HookedError)]
        builtin_bases = {b.__name__ for b in cls.__bases__ if not issubclass(b, HookedError)}
        tree[name] = (hooked_bases[0].__name__, builtin_bases)
    return tree


@pytest.mark.parametrize("source", ["hooked/core/errors.py", "docs/errors-and-guarantees.md"])
def test_documented_tree_matches_the_classes(source):
    text = errors.__doc__ if source.endswith(".py") else (REPO / source).read_text(encoding="utf-8")
    documented, actual = _parse_tree(text), _actual_tree()
    missing = sorted(set(actual) - set(documented))
    extra = sorted(set(documented) - set(actual))
    wrong = sorted(n for n in set(actual) & set(documented) if actual[n] != documented[n])
    assert not (missing or extra or wrong), (
        f"the error tree in {source} is out of date: missing {missing}, no such class {extra}, "
        f"wrong parent or built-in bases {[(n, actual[n]) for n in wrong]}"
    )
