"""Dependencies point one way: each layer of `hooked` imports only the layers below it.

Read from the source (every import statement, including those inside functions; imports
under `if TYPE_CHECKING:` are for annotations only and are not counted), so an upward
import or a cycle between layers fails here, naming the file and line.
"""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[3]

# bottom to top; a package may import its own layer's modules and any layer below
LAYERS: list[tuple[str, ...]] = [
    ("hooked._version", "hooked.core"),
    ("hooked.components",),
    ("hooked.processing", "hooked.placement"),
    ("hooked.loading",),
    ("hooked.analysis",),
    ("hooked.generation",),
    ("hooked.models",),
    ("hooked.circuits", "hooked.harvest"),
    ("hooked.viz",),
    ("hooked.scale",),
    ("hooked.serve", "hooked.remote"),
    ("hooked.compat", "hooked.cli", "hooked._moved_modules", "hooked"),
]
# the folders that install as `hooked.components` and `hooked.loading`
SOURCE_ROOTS = {"hooked": "hooked", "components": "hooked.components", "loading": "hooked.loading"}


def module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    parts[0] = SOURCE_ROOTS[parts[0]]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def layer_of(module: str) -> int:
    """The index in LAYERS of the longest entry that `module` is or lies under."""
    best, best_len = None, -1
    for index, entries in enumerate(LAYERS):
        for entry in entries:
            if (module == entry or module.startswith(entry + ".")) and len(entry) > best_len:
                best, best_len = index, len(entry)
    assert best is not None, f"{module} is in no layer: add it to LAYERS"
    return best


def imported_modules(path: pathlib.Path, module: str) -> list[tuple[str, int]]:
    """`(module imported, line)` for every `hooked` import in the file, outside TYPE_CHECKING blocks."""
    tree = ast.parse(path.read_text(), str(path))
    typing_only = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            typing_only.update(id(child) for stmt in node.body for child in ast.walk(stmt))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            found += [
                (f"{base}.{alias.name}" if _is_module(f"{base}.{alias.name}") else base, node.lineno)
                for alias in node.names
            ]
    return [(name, line) for name, line in found if name == "hooked" or name.startswith("hooked.")]


def _is_module(name: str) -> bool:
    return name in MODULES


def _all_modules() -> dict[str, pathlib.Path]:
    return {module_name(p): p for root in SOURCE_ROOTS for p in (ROOT / root).rglob("*.py")}


MODULES = _all_modules()


def test_every_module_is_in_a_layer():
    for module in MODULES:
        layer_of(module)


def test_imports_point_down():
    upward = []
    for module, path in sorted(MODULES.items()):
        own = layer_of(module)
        for target, line in imported_modules(path, module):
            if layer_of(target) > own:
                upward.append(f"{path.relative_to(ROOT)}:{line} imports {target} (layer {layer_of(target)} > {own})")
    assert not upward, "imports that point up the layers:\n" + "\n".join(upward)


def test_the_layer_test_sees_an_upward_import(tmp_path):
    """The checker itself: a planted upward import is reported."""
    planted = ROOT / "hooked" / "core" / "hook_points.py"
    tree_imports = imported_modules(planted, "hooked.core.hook_points")
    assert all(layer_of(t) == 0 for t, _ in tree_imports)
    fake = tmp_path / "probe.py"
    fake.write_text("def f():\n    from hooked.models.hooked_transformer import HookedTransformer\n")
    found = imported_modules(fake, "hooked.core.probe")
    assert [layer_of(t) for t, _ in found] == [layer_of("hooked.models")]


# -- forbidden pairs: what a room may not name, beyond imports ------------------------------------
MODEL_ROOMS = ("hooked.models", "hooked.scale", "hooked.remote", "hooked.serve")
MODEL_KIND_FLAGS = {"is_remote", "is_pipeline"}
TRACING_LIBRARIES = {"nnsight", "pyvene", "baukit", "nnterp"}


def _in(module: str, rooms: tuple[str, ...]) -> bool:
    return any(module == room or module.startswith(room + ".") for room in rooms)


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the docstring constants (prose may name anything; code may not)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def named_in_code(source: str) -> list[tuple[str, int]]:
    """`(word, line)` for every name, attribute, imported module and non-docstring string in `source`."""
    tree = ast.parse(source)
    skip = _docstrings(tree)
    words = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            words.append((node.id, node.lineno))
        elif isinstance(node, ast.Attribute):
            words.append((node.attr, node.lineno))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            words.extend((w, node.lineno) for w in node.value.replace(".", " ").split())
        elif isinstance(node, ast.Import | ast.ImportFrom):
            mods = [a.name for a in node.names] + (
                [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
            )
            words.extend((part, node.lineno) for m in mods for part in m.split("."))
    return words


def forbidden_words(module: str, source: str) -> list[str]:
    """The forbidden pairs: a method room (outside the model rooms) never reads a model kind's flag, and
    `hooked.core` never names a third-party tracing library (its observer registers from hooked.compat)."""
    bad = []
    for word, line in named_in_code(source):
        if word in MODEL_KIND_FLAGS and not _in(module, MODEL_ROOMS):
            bad.append(f"{module}:{line} reads the model-kind flag {word} (ask the model: a method or seam)")
        if _in(module, ("hooked.core",)) and any(word.lower().startswith(lib) for lib in TRACING_LIBRARIES):
            bad.append(f"{module}:{line} names the tracing library {word} (register an observer from hooked.compat)")
    return bad


def test_no_forbidden_pairs():
    bad = [b for module, path in sorted(MODULES.items()) for b in forbidden_words(module, path.read_text())]
    assert not bad, "\n".join(bad)


def test_the_forbidden_pairs_are_caught():
    """The checker itself: each planted violation is reported, and its legal twin is not."""
    flag = 'def f(model):\n    return getattr(model, "is_remote", False) or model.is_pipeline\n'
    assert len(forbidden_words("hooked.analysis.probe", flag)) == 2
    assert forbidden_words("hooked.remote.probe", flag) == []
    tracer = "def f(m):\n    from nnsight import NNsight\n    return m.__dict__.get('__nnsight__')\n"
    assert len(forbidden_words("hooked.core.probe", tracer)) >= 2
    assert forbidden_words("hooked.compat.probe", tracer) == []
    prose = 'def f():\n    """nnsight and is_remote in a docstring are prose."""\n'
    assert forbidden_words("hooked.core.probe", prose) == []
