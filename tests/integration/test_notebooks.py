"""Every notebook in notebooks/ runs top to bottom on SmolLM2 and draws its figures.

Each notebook is executed with nbclient in a fresh "python3" kernel (this venv's
interpreter: jupyter_client starts the native kernelspec with `sys.executable`), from
the notebooks/ directory, with matplotlib's inline backend. The test fails on any cell
error and on a notebook that shows no `image/png` output, and prints each run time
(the suite's budget is about 5 minutes for all notebooks together, on 2 CPU threads).

The saved notebooks must be stripped (no outputs, no execution counts); that check is
fast and not marked slow.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import nbclient  # dev extra: a missing kernel stack fails the suite instead of skipping it
import nbformat
import pytest

NOTEBOOKS_DIR = Path(__file__).resolve().parents[2] / "notebooks"
NOTEBOOKS = sorted(NOTEBOOKS_DIR.glob("*.ipynb"))
CELL_TIMEOUT_S = 300
KERNEL_ENV = {**os.environ, "MPLBACKEND": "module://matplotlib_inline.backend_inline"}  # figures as image/png


def execute(nb, cwd: Path = NOTEBOOKS_DIR):
    client = nbclient.NotebookClient(
        nb, kernel_name="python3", timeout=CELL_TIMEOUT_S, resources={"metadata": {"path": str(cwd)}}
    )
    client.execute(env=KERNEL_ENV)
    return nb


def outputs(nb):
    return [out for cell in nb.cells if cell.cell_type == "code" for out in cell.get("outputs", [])]


def test_there_are_notebooks():
    names = {p.name for p in NOTEBOOKS}
    assert {
        "main_demo.ipynb",
        "activation_patching.ipynb",
        "induction_heads.ipynb",
        "nnsight.ipynb",
        "harvest_to_sae.ipynb",
    } <= names, names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_saved_notebook_is_stripped(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, f"{path.name}: cell {i} has outputs"


@pytest.mark.slow
def test_kernel_runs_this_interpreter():
    nb = nbformat.v4.new_notebook()
    nb.cells.append(nbformat.v4.new_code_cell("import sys; print(sys.prefix)"))
    execute(nb)
    printed = "".join(out.get("text", "") for out in outputs(nb)).strip()
    assert Path(printed).resolve() == Path(sys.prefix).resolve(), (printed, sys.prefix)


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs_and_draws_figures(path):
    nb = nbformat.read(path, as_version=4)
    start = time.perf_counter()
    try:
        execute(nb)
    except nbclient.exceptions.CellExecutionError as err:
        pytest.fail(f"{path.name} failed:\n{err}")
    elapsed = time.perf_counter() - start
    print(f"\n{path.name}: ran in {elapsed:.1f} s")
    errors = [out for out in outputs(nb) if out.output_type == "error"]
    assert not errors, f"{path.name}: {errors[0].ename}: {errors[0].evalue}"
    images = [out for out in outputs(nb) if "image/png" in out.get("data", {})]
    assert images, f"{path.name} produced no image/png output (its figures)"
