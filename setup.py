"""Package discovery for the one import name `hooked`.

The repository keeps `components/` and `loading/` beside `hooked/` (the project's layout),
but they install as `hooked.components` and `hooked.loading`: site-packages gets a single
top-level name, and a user's own `loading.py` cannot shadow the library. Every subpackage
is found by `find_packages`, so a new folder with an `__init__.py` cannot be left out.
"""

from setuptools import find_packages, setup

# folder in the repository -> import name it installs as
MAPPED = {"components": "hooked.components", "loading": "hooked.loading"}


def _packages() -> list[str]:
    found = find_packages(include=["hooked", "hooked.*"])
    for folder, name in MAPPED.items():
        found += [name] + [f"{name}.{sub}" for sub in find_packages(where=folder)]
    return found


setup(packages=_packages(), package_dir={"hooked": "hooked", **{name: folder for folder, name in MAPPED.items()}})
