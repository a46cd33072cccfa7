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


# -- forbidden pairs: what a room may not know, beyond the import direction --------------------------------

#: the rooms that hold methods: they work on any hooked model through hook points and seams
METHOD_ROOMS = ("hooked.analysis", "hooked.circuits", "hooked.harvest", "hooked.viz")
#: flags that say which kind a model is; a method asks a registry (hooked.analysis.model_kinds) instead
MODEL_KIND_FLAGS = {"is_remote", "is_pipeline", "is_served", "is_encoder", "is_hybrid", "is_vision_language"}


def model_kind_reads(path: pathlib.Path) -> list[int]:
    """Lines that read a model-kind flag: `model.is_remote`, or its name in `getattr`/`hasattr`."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Attribute) and node.attr in MODEL_KIND_FLAGS:
            lines.append(node.lineno)
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("getattr", "hasattr"):
            names = [a.value for a in node.args[1:2] if isinstance(a, ast.Constant)]
            lines += [node.lineno for name in names if name in MODEL_KIND_FLAGS]
    return lines


def test_method_rooms_never_ask_which_kind_a_model_is():
    found = [
        f"{path.relative_to(ROOT)}:{line}"
        for module, path in sorted(MODULES.items())
        if module.startswith(METHOD_ROOMS)
        for line in model_kind_reads(path)
    ]
    assert not found, "a method room reads a model-kind flag (register in hooked.analysis.model_kinds):\n" + "\n".join(
        found
    )


def test_the_kind_flag_check_sees_a_planted_read(tmp_path):
    fake = tmp_path / "probe.py"
    fake.write_text(
        "def f(model):\n    if model.is_pipeline:\n        return 1\n    return getattr(model, 'is_remote', False)\n"
    )
    assert model_kind_reads(fake) == [2, 4]


# -- the ground floor names no tracing library: its observer registers from hooked.compat --------------
TRACING_LIBRARIES = ("nnsight", "pyvene", "baukit", "nnterp")


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


def tracing_library_names(module: str, source: str) -> list[str]:
    """Where `hooked.core` code names a third-party tracing library (other rooms may)."""
    if not (module == "hooked.core" or module.startswith("hooked.core.")):
        return []
    return [
        f"{module}:{line} names the tracing library in {word} (register an observer from hooked.compat)"
        for word, line in named_in_code(source)
        if word.lower().strip("_").startswith(TRACING_LIBRARIES)
    ]


def test_core_never_names_a_tracing_library():
    bad = [b for module, path in sorted(MODULES.items()) for b in tracing_library_names(module, path.read_text())]
    assert not bad, "\n".join(bad)


def test_the_tracing_library_check_sees_a_planted_name():
    """The checker itself: an import, a name and a string key are caught in core, not in compat or prose."""
    tracer = "def f(m):\n    from nnsight import NNsight\n    return m.__dict__.get('__nnsight__'), nnsight_waits_on\n"
    assert len(tracing_library_names("hooked.core.probe", tracer)) == 4  # module, NNsight, key, function
    assert tracing_library_names("hooked.compat.probe", tracer) == []
    prose = 'def f():\n    """nnsight in a docstring is prose."""\n'
    assert tracing_library_names("hooked.core.probe", prose) == []
