"""Write the public API of `hooked` trees as `module:name` lines (the data of test_public_api.py).

public_api.txt is made from two trees: the tree before the restructure (commit f163b73), so
that every name a user could import then is still importable now, and the tree of the commit
that last remade it, so that today's API stays. To remake it, lay each tree out as it installs,
`components/` and `loading/` inside `hooked/`, and run this script against the copies:

    for tree in f163b73 HEAD; do mkdir -p /tmp/api/$tree && git archive $tree hooked components loading \
        | tar -x -C /tmp/api/$tree && mv /tmp/api/$tree/components /tmp/api/$tree/loading /tmp/api/$tree/hooked/; done
    .venv/bin/python tests/unit/project/_public_api_snapshot.py /tmp/api/f163b73 /tmp/api/HEAD \
        > tests/unit/project/public_api.txt

A line `module:` (empty name) says the module imports; `module:name` says it has that attribute.
The API is what a module declares: its `__all__` (a module without one promises its path, not its
globals: `logger`, helpers and imported names are not API). Then the `transformer_lens.*` paths
of `hooked.compat.aliasing.TL_MODULES` with the names TransformerLens users import from them
(TransformerLens declares no `__all__`): every name not starting with `_` that the module defines
or imports from `hooked`, less module objects and loggers, as seen after
`hooked.compat.alias_transformer_lens()`.
"""

from __future__ import annotations

import ast
import importlib
import logging
import pathlib
import subprocess
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


def declared_names(module: types.ModuleType) -> set[str]:
    """The names `module` declares as its API: its `__all__` (none without one)."""
    return set(getattr(module, "__all__", ()))


def transformer_lens_names(module: types.ModuleType) -> set[str]:
    """The names of a `transformer_lens.*` path that TransformerLens's users import (see the module docstring)."""
    path = getattr(module, "__file__", None)
    own, foreign = bound_names(pathlib.Path(path).read_text()) if path else (set(), set())
    names = set(getattr(module, "__all__", ()))
    for name, value in vars(module).items():
        if name.startswith("_") or isinstance(value, (types.ModuleType, logging.Logger)):
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
    lines = set()
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
        lines.update(f"{name}:{attr}" for attr in declared_names(module))
    from hooked.compat import aliasing

    aliasing.alias_transformer_lens(strict=True)
    try:
        for path in aliasing.TL_MODULES:
            lines.add(path + ":")
            lines.update(f"{path}:{attr}" for attr in transformer_lens_names(sys.modules[path]))
    finally:
        aliasing.unalias_transformer_lens()
    return sorted(lines)


HEADER = "# made by tests/unit/project/_public_api_snapshot.py from the trees of commits {} (read its docstring)"


def snapshot_in_child(root: str) -> list[str]:
    """`snapshot(root)` in a fresh interpreter: two trees cannot share one `hooked` in `sys.modules`."""
    code = f"import pathlib, sys; sys.path.insert(0, {str(pathlib.Path(__file__).parent)!r}); "
    code += f"import _public_api_snapshot as s; print(chr(10).join(s.snapshot(pathlib.Path({root!r}).resolve())))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root)
    sys.stderr.write(done.stderr)
    return done.stdout.split()


if __name__ == "__main__":
    roots = sys.argv[1:]
    lines = sorted(set().union(*(snapshot_in_child(root) for root in roots)))
    print("\n".join([HEADER.format(" and ".join(pathlib.Path(root).name for root in roots)), *lines]))
