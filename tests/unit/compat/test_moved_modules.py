"""The module paths of earlier releases (hooked/_moved_modules.py): same object, own spec, a dated warning.

Each check runs in a fresh interpreter: whether an old path warns, and which spec a module carries,
depend on what the process imported first, which inside the suite is another test's business.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

from hooked._moved_modules import MOVED_MODULES, PUBLIC_OLD_PATHS, REMOVED_IN


def run_fresh(code: str) -> subprocess.CompletedProcess[str]:
    """Run `code` in a new interpreter with every warning shown; fail with its stderr if it fails."""
    done = subprocess.run(
        [sys.executable, "-W", "always", "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done


def test_reload_after_importing_the_old_path():
    """The old path hands out the new module without renaming it, so reloading it reloads the new name."""
    run_fresh("""
        import importlib
        import hooked.patching
        import hooked.analysis.patching
        assert hooked.patching is hooked.analysis.patching
        assert hooked.analysis.patching.__spec__.name == "hooked.analysis.patching"
        reloaded = importlib.reload(hooked.analysis.patching)
        assert reloaded is hooked.analysis.patching
        assert reloaded.__spec__.name == "hooked.analysis.patching"
    """)


def test_an_old_internal_path_warns_with_the_new_path_and_a_date():
    stderr = run_fresh("import hooked.hook_points\nimport hooked.hook_points").stderr
    assert stderr.count("DeprecationWarning") == 1  # once, at the first import
    assert f"`hooked.hook_points` is an old module path, removed in hooked {REMOVED_IN}" in stderr
    assert "import `hooked.core.hook_points`" in stderr
    assert "<string>:1: DeprecationWarning" in stderr  # pointed at the import line, not the import machinery


def test_public_old_paths_and_transformer_lens_paths_do_not_warn():
    code = "import hooked.compat\nhooked.compat.alias_transformer_lens()\n"
    code += "".join(f"import {path}\n" for path in sorted(PUBLIC_OLD_PATHS))
    code += "import transformer_lens.hook_points, transformer_lens.utils, transformer_lens.HookedTransformer\n"
    assert "DeprecationWarning" not in run_fresh(code).stderr


def test_every_other_old_path_warns():
    """Each old path outside the public three warns once, naming its own new path."""
    internal = sorted(set(MOVED_MODULES) - PUBLIC_OLD_PATHS)
    stderr = run_fresh("".join(f"import {path}\n" for path in internal)).stderr
    for path in internal:
        assert f"`{path}` is an old module path" in stderr and f"import `{MOVED_MODULES[path]}`" in stderr, path
    assert stderr.count("DeprecationWarning: `hooked.") == len(internal)
