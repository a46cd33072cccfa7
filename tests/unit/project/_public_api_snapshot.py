"""Write the public API of a `hooked` tree as `module:name` lines (the data of test_public_api.py).

public_api.txt was made from the tree before the restructure (commit f163b73), so that every
name a user could import then is still importable now. To remake it (or to snapshot another
tree), lay the tree out as it installs, `components/` and `loading/` inside `hooked/`, and run
this script against that copy:

    mkdir /tmp/old && git archive f163b73 hooked components loading | tar -x -C /tmp/old
    mv /tmp/old/components /tmp/old/loading /tmp/old/hooked/
    .venv/bin/python tests/unit/project/_public_api_snapshot.py /tmp/old > tests/unit/project/public_api.txt

A line `module:` (empty name) says the module imports; `module:name` says it has that attribute.
Listed per module: every name not starting with `_` that the module defines (def, class,
assignment) or imports from `hooked` (a re-export), plus its `__all__`. Names imported from
outside `hooked` (`torch`, `Float`, `Any`, `logging`) and module objects are left out: they are
not this library's API. Then the `transformer_lens.*` paths of `hooked.compat.aliasing.TL_MODULES`
with the same names, as seen after `hooked.compat.alias_transformer_lens()`.
"""

from __future__ import annotations

import ast
import importlib
import pathlib
import sys
import types
import warnings


def bound_names(source: str) -> tuple[set[str], set[str]]:
    """`(own, foreign)`: top-level names defined or imported from `hooked`, and those imported from outside."""
    own: set[str] = set()
    foreign: set[str] = set()

    def visit(statements: list[ast.stmt]) -> None:
        for node in statements:
            if isinstance(node, ast.Import):
                for alias in node.names:
                    name = alias.asname or alias.name.split(".")[0]
                    (own if alias.name.startswith("hooked.") or alias.name == "hooked" else foreign).add(name)
            elif isinstance(node, ast.ImportFrom):
                internal = node.level > 0 or (node.module or "").split(".")[0] == "hooked"
                for alias in node.names:
                    (own if internal else foreign).add(alias.asname or alias.name)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                own.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    own.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
            elif isinstance(node, ast.If):
                visit(node.body)
                visit(node.orelse)
            elif isinstance(node, (ast.Try, ast.With)):
                visit(node.body)
                for handler in getattr(node, "handlers", []):
                    visit(handler.body)
                visit(getattr(node, "orelse", []))
                visit(getattr(node, "finalbody", []))

    visit(ast.parse(source).body)
    return own, foreign


def public_names(module: types.ModuleType) -> set[str]:
    """The names of `module` that are this library's API (see the module docstring)."""
    path = getattr(module, "__file__", None)
    own, foreign = bound_names(pathlib.Path(path).read_text()) if path else (set(), set())
    names = set(getattr(module, "__all__", ()))
    for name, value in vars(module).items():
        if name.startswith("_") or isinstance(value, types.ModuleType):
            continue
        if name in own or (name not in foreign and str(getattr(value, "__module__", "")).startswith("hooked")):
            names.add(name)
    return names


def module_names(root: pathlib.Path) -> list[str]:
    """Every module of the `hooked` package under `root` (`root/hooked/...`), private ones included."""
    names = []
    for path in sorted((root / "hooked").rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names.append(".".join(parts))
    return names


def snapshot(root: pathlib.Path) -> list[str]:
    """The sorted `module:name` lines of the tree at `root` (imported from there, not from site-packages)."""
    sys.path.insert(0, str(root))
    import hooked

    assert pathlib.Path(hooked.__file__).is_relative_to(root), f"imported {hooked.__file__}, not the tree at {root}"
    lines = {"hooked:" + name for name in hooked.__all__}
    warnings.simplefilter("ignore")  # deprecation notes of old helpers are not the API's business here
    for name in module_names(root):
        if name.rpartition(".")[2].startswith("_") or "._" in name:
            continue
        try:
            module = importlib.import_module(name)
        except ImportError as error:  # an optional dependency missing here: say so rather than drop silently
            print(f"skipped {name}: {error}", file=sys.stderr)
            continue
        lines.add(name + ":")
        lines.update(f"{name}:{attr}" for attr in public_names(module))
    from hooked.compat import aliasing

    aliasing.alias_transformer_lens(strict=True)
    try:
        for path in aliasing.TL_MODULES:
            lines.add(path + ":")
            lines.update(f"{path}:{attr}" for attr in public_names(sys.modules[path]))
    finally:
        aliasing.unalias_transformer_lens()
    return sorted(lines)


HEADER = "# made by tests/unit/project/_public_api_snapshot.py from the tree of commit f163b73 (read its docstring)"

if __name__ == "__main__":
    print("\n".join([HEADER, *snapshot(pathlib.Path(sys.argv[1]).resolve())]))
