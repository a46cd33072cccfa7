"""Every public name of the API, before the restructure and now, is still importable by its path.

public_api.txt lists, one `module:name` a line, what the trees of commit f163b73 (before the
restructure) and of the commit that last remade it declare: their modules (old flat paths such as
`hooked.hook_points` resolve through hooked/_moved_modules.py, with a DeprecationWarning), each
module's `__all__`, and the `transformer_lens.*` paths that `hooked.compat.alias_transformer_lens()`
provides with their names. _public_api_snapshot.py made the file and says how to remake it.
"""

from __future__ import annotations

import importlib
import pathlib
import sys

import pytest

SNAPSHOT = pathlib.Path(__file__).with_name("public_api.txt")


def snapshot_lines() -> list[tuple[str, str]]:
    lines = [line for line in SNAPSHOT.read_text().splitlines() if line and not line.startswith("#")]
    return [tuple(line.split(":", 1)) for line in lines]


def missing_names(lines: list[tuple[str, str]]) -> list[str]:
    """The `module:name` lines that do not resolve, each with the reason."""
    missing, broken = [], set()
    for module_name, name in lines:
        if module_name in broken:
            continue
        try:
            module = importlib.import_module(module_name)
        except ImportError as error:
            missing.append(f"{module_name}: does not import ({error})")
            broken.add(module_name)
            continue
        if name and not hasattr(module, name):
            missing.append(f"{module_name}:{name}")
    return missing


@pytest.fixture
def transformer_lens_alias():
    from hooked.compat import alias_transformer_lens, unalias_transformer_lens

    already = "transformer_lens" in sys.modules  # another test module aliased at import: leave it so
    alias_transformer_lens(strict=True)
    yield
    if not already:
        unalias_transformer_lens()


def test_the_snapshot_covers_the_old_api():
    """The data is the whole API, not a sample (a truncated file would make the next tests vacuous)."""
    lines = snapshot_lines()
    modules = {module for module, _ in lines}
    assert len(lines) > 2000
    assert {"hooked", "hooked.hook_points", "hooked.components.attention", "hooked.loading.registry"} <= modules
    assert {"hooked.analysis.patching", "hooked.core.hook_points"} <= modules  # the tree of today too
    assert {"transformer_lens.utils", "transformer_lens.components.mlps.mlp"} <= modules
    assert ("hooked", "HookedTransformer") in lines and ("transformer_lens.hook_points", "HookPoint") in lines


@pytest.mark.filterwarnings("ignore:.* is an old module path:DeprecationWarning")  # imported on purpose
def test_the_snapshot_is_declared_names_not_every_global():
    """A module's API is its `__all__`: a logger or an imported helper is not frozen as a promise."""
    lines = snapshot_lines()
    assert not [line for line in lines if line[1] == "logger"]
    undeclared = [
        f"{module}:{name}"
        for module, name in lines
        if name
        and not module.startswith("transformer_lens")
        and name not in getattr(importlib.import_module(module), "__all__", ())
    ]
    assert not undeclared, f"listed as API but in no `__all__`: {undeclared}"


@pytest.mark.filterwarnings("ignore:.* is an old module path:DeprecationWarning")  # imported on purpose
def test_every_old_hooked_name_still_imports():
    lines = [line for line in snapshot_lines() if not line[0].startswith("transformer_lens")]
    missing = missing_names(lines)
    assert not missing, (
        f"{len(missing)} public names of the API before the restructure no longer import. Re-export each "
        "from the module that now holds its old path (hooked/_moved_modules.py maps old paths):\n" + "\n".join(missing)
    )


def test_every_transformer_lens_path_still_imports(transformer_lens_alias):
    lines = [line for line in snapshot_lines() if line[0].startswith("transformer_lens")]
    missing = missing_names(lines)
    assert not missing, (
        f"{len(missing)} transformer_lens names no longer resolve after alias_transformer_lens(). Restore each "
        "in the module hooked/compat/aliasing.py's TL_MODULES maps its path to:\n" + "\n".join(missing)
    )


def test_a_lost_name_is_reported():
    """The checker itself: a name that does not exist, and a module that does not, are both listed."""
    assert missing_names([("hooked.hook_points", "HookPoint"), ("hooked.hook_points", "NoSuchName")]) == [
        "hooked.hook_points:NoSuchName"
    ]
    [line] = missing_names([("hooked.no_such_module", ""), ("hooked.no_such_module", "HookPoint")])
    assert line.startswith("hooked.no_such_module: does not import")
