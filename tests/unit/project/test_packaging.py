"""The distribution has one import name: `components/` and `loading/` install as
`hooked.components` and `hooked.loading`, so a user's own `loading.py` cannot shadow them."""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

from packaging.requirements import Requirement

import hooked
import hooked.components
import hooked.loading

REPO = Path(__file__).resolve().parents[3]
SOURCE_FOLDERS = ("hooked", "components", "loading", "tests", "benchmarks")


def test_version_is_the_distributions():
    assert hooked.__version__ == importlib.metadata.version("hooked")


def test_no_code_imports_the_folders_as_top_level_packages():
    offenders = []
    for folder in SOURCE_FOLDERS:
        for path in (REPO / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                names = []
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                offenders += [
                    f"{path.relative_to(REPO)}:{node.lineno}"
                    for n in names
                    if n.split(".")[0] in ("components", "loading")
                ]
    assert not offenders, f"import hooked.components / hooked.loading instead: {offenders}"


def test_user_files_named_loading_or_components_do_not_shadow_the_library(tmp_path):
    for name in ("loading", "components"):
        (tmp_path / f"{name}.py").write_text(f"raise ImportError('the user\\'s own {name}.py was imported')\n")
    script = (
        "import sys, torch\n"
        "import hooked, hooked.loading, hooked.components\n"
        "from hooked import HookedTransformer, HookedTransformerConfig\n"
        "assert 'loading' not in sys.modules and 'components' not in sys.modules, sorted(sys.modules)\n"
        "cfg = HookedTransformerConfig(n_layers=1, d_model=16, n_ctx=8, d_head=4, n_heads=4, d_vocab=11, "
        "act_fn='gelu', normalization_type='LN')\n"
        "model = HookedTransformer(cfg)\n"
        "print(tuple(model(torch.zeros(1, 3, dtype=torch.long)).shape), hooked.loading.__name__)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["(1,", "3,", "11)", "hooked.loading"]


def test_the_test_process_sees_the_package_as_users_do():
    """One object per module: in the test process the checkout's folders import only as `hooked.*`.

    With the checkout on `sys.path`, `loading.bundled` and `hooked.loading.bundled` would be two
    module objects (two executions, two sets of module-level state); tests/conftest.py keeps it off.
    """
    for name in ("components", "loading"):
        assert name not in sys.modules
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as error:
            assert error.name == name
        else:
            raise AssertionError(f"`import {name}` works in the test process: the checkout is on sys.path")
    assert hooked.loading.__name__ == "hooked.loading" and hooked.components.__name__ == "hooked.components"
    assert not [entry for entry in sys.path if Path(entry or ".").resolve() == REPO]


def test_dev_installs_every_other_extra():
    """`[dev]` writes the other extras' requirements out again (`make test` runs what each enables): none may drift."""
    extras = defaultdict(set)  # extra -> its requirements, as the installed distribution declares them
    for line in importlib.metadata.requires("hooked") or ():
        req = Requirement(line)
        for name in importlib.metadata.metadata("hooked").get_all("Provides-Extra") or ():
            if req.marker is not None and req.marker.evaluate({"extra": name}):
                extras[name].add(str(Requirement(line.split(";")[0])))
    dev = extras.pop("dev")
    missing = {name: sorted(reqs - dev) for name, reqs in extras.items() if reqs - dev}
    assert not missing, f"add these to the dev extra in pyproject.toml: {missing}"
