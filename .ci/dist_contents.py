"""Check what the wheel and the sdist contain.

The wheel: exactly one top-level import name (`hooked`), every module of the source
tree (`hooked/`, `components/` as `hooked/components/`, `loading/` as `hooked/loading/`),
the `py.typed` marker and the licence. The sdist: the same sources, nothing from
`tests/`, `benchmarks/` or `notebooks/`.
Usage: python dist_contents.py WHEEL SDIST
"""

from __future__ import annotations

import sys
import tarfile
import zipfile
from pathlib import Path

TREE = Path(__file__).resolve().parents[1]
ROOTS = {"hooked": "hooked", "components": "hooked/components", "loading": "hooked/loading"}
KEPT_OUT = ("tests/", "benchmarks/", "notebooks/", "docs/")


def expected_files() -> set[str]:
    files = set()
    for folder, installed in ROOTS.items():
        for path in (TREE / folder).rglob("*.py"):
            files.add(f"{installed}/{path.relative_to(TREE / folder).as_posix()}")
    return files | {"hooked/py.typed"}


def check_wheel(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    if tops != {"hooked"}:
        raise SystemExit(f"the wheel installs top-level names {sorted(tops)}; only 'hooked' is allowed")
    missing = expected_files() - names
    if missing:
        raise SystemExit(f"the wheel lacks {len(missing)} files of the source tree, e.g. {sorted(missing)[:5]}")
    if not any(n.endswith(".dist-info/licenses/LICENSE") for n in names):
        raise SystemExit("the wheel carries no LICENSE")
    print(f"wheel: {len(names)} files, one top-level package, every module present")


def check_sdist(sdist: Path) -> None:
    with tarfile.open(sdist) as tar:
        names = [n.split("/", 1)[1] for n in tar.getnames() if "/" in n]
    leaked = [n for n in names if n.startswith(KEPT_OUT)]
    if leaked:
        raise SystemExit(f"the sdist carries {leaked[:5]}")
    sources = {n for n in names if n.endswith(".py")}
    wanted = {
        f"{folder}/{p.relative_to(TREE / folder).as_posix()}" for folder in ROOTS for p in (TREE / folder).rglob("*.py")
    }
    if wanted - sources:
        raise SystemExit(f"the sdist lacks {sorted(wanted - sources)[:5]}")
    print(f"sdist: {len(names)} entries, every module present, no tests/benchmarks/notebooks/docs")


if __name__ == "__main__":
    check_wheel(Path(sys.argv[1]))
    check_sdist(Path(sys.argv[2]))
