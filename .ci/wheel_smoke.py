"""Smoke test of an installed (non-editable) `hooked` wheel, run from outside the clone.

Usage: python wheel_smoke.py SOURCE_TREE WORK_DIR

SOURCE_TREE is the clone: the list of modules to import is generated from its
`hooked/`, `components/` and `loading/` folders (the latter two install as
`hooked.components` and `hooked.loading`), so a module the wheel forgot fails here.
Every module must load from site-packages, never from the clone.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

# folder in the clone -> import name it installs as
ROOTS = {"hooked": "hooked", "components": "hooked.components", "loading": "hooked.loading"}


def source_modules(tree: Path) -> list[str]:
    """Every module name the source tree defines, in the installed naming."""
    names = []
    for folder, package in ROOTS.items():
        for path in sorted((tree / folder).rglob("*.py")):
            parts = list(path.relative_to(tree / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            names.append(".".join([package, *parts]))
    return names


#: an optional dependency's import error names the extra that installs it (hooked.compat.nnsight's, for one)
NEEDS_EXTRA = re.compile(r"pip install 'hooked\[(\w+)\]'")


def check_imports(tree: Path, site: Path) -> None:
    """Import every module of the tree from the wheel. A module whose optional dependency is not installed here
    must still be in the wheel and must fail with the error that names its extra."""
    names, needs_extra = source_modules(tree), []
    for name in names:
        spec = importlib.util.find_spec(name)
        origin = Path(spec.origin).resolve() if spec and spec.origin else None
        if origin is None or tree.resolve() in origin.parents or site not in origin.parents:
            raise SystemExit(f"{name} is not in the installed wheel under {site} (found: {origin})")
        try:
            importlib.import_module(name)
        except ImportError as err:
            extra = NEEDS_EXTRA.search(str(err))
            if extra is None:
                raise
            needs_extra.append(f"{name} ([{extra.group(1)}])")
    print(f"imported {len(names) - len(needs_extra)} modules from {site}; told which extra to install: {needs_extra}")


def run(*args: str, cwd: Path) -> str:
    done = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return done.stdout


def check_cli(work: Path) -> None:
    hooked = str(Path(sys.executable).with_name("hooked"))
    assert "inspect" in run(hooked, "--help", cwd=work)
    report = run(hooked, "inspect", "The Eiffel Tower is in the city of", cwd=work)
    assert "logit lens" in report.lower(), report
    corpus = work / "corpus.txt"
    corpus.write_text("\n".join(f"Line {i} of a small corpus about towers and cities." for i in range(40)))
    out = work / "harvest"
    run(
        hooked,
        "harvest",
        "--model",
        "smollm2-135m",
        "--corpus",
        str(corpus),
        "--hooks",
        "blocks.1.hook_resid_post",
        "--out",
        str(out),
        "--context-length",
        "16",
        "--max-tokens",
        "128",
        "--no-progress",
        cwd=work,
    )
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest, "empty harvest manifest"
    print("hooked --help, inspect and harvest ran")


def check_library(work: Path) -> None:
    import torch

    from hooked import HookedTransformer
    from hooked.circuits.attribution import attribution_patch
    from hooked.viz import attention_patterns

    model = HookedTransformer.from_pretrained("smollm2-135m")
    clean = model.to_tokens(["When Mary and John went out, John gave a drink to"])
    corrupted = model.to_tokens(["When Mary and John went out, Anna gave a drink to"])
    _, cache = model.run_with_cache(clean)
    page = attention_patterns(model, cache, layer=0, tokens=clean)
    page.save(work / "attention.html")
    assert (work / "attention.html").stat().st_size > 1000
    mary = model.to_single_token(" Mary")

    def metric(logits: torch.Tensor) -> torch.Tensor:
        return logits[:, -1, mary].sum()

    scores = attribution_patch(model, clean, corrupted, metric, "blocks.0.hook_resid_pre")
    assert scores["blocks.0.hook_resid_pre"].shape == clean.shape + (model.cfg.d_model,)
    print("viz page and attribution_patch ran")


def check_transformer_lens_alias() -> None:
    from hooked.compat import alias_transformer_lens

    alias_transformer_lens()
    import sae_lens  # noqa: F401  # SAELens imports transformer_lens: the alias must satisfy it
    import transformer_lens

    assert transformer_lens.HookedTransformer.__module__.startswith("hooked"), transformer_lens.HookedTransformer
    print("transformer_lens alias and sae_lens imported")


def main() -> None:
    tree, work = Path(sys.argv[1]).resolve(), Path(sys.argv[2]).resolve()
    os.chdir(work)
    # the clone must not be importable: only the wheel counts
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != tree]
    site = Path(importlib.import_module("hooked").__file__).resolve().parents[1]
    check_imports(tree, site)
    check_cli(work)
    check_library(work)
    check_transformer_lens_alias()
    print("wheel smoke test passed")


if __name__ == "__main__":
    main()
