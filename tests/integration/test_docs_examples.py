"""Every Python example in README.md and docs/*.md runs as written: one test per ```python block.

The blocks of one page share a namespace and run in page order (a block may use what an earlier
block of its page defined); selecting one block with `-k` first runs the blocks before it.

Fences (docs/contributing.md, "Code blocks in the docs"):
- ```python: run here.
- ```python fragment: not run, by design (it needs a download, a cluster or the reader's own data);
  keep these few: the page's other blocks or the module's tests run the same calls.
- ```python NAME: run by the dedicated test named in CLAIMED below (a torchrun script, a check
  with more assertions than a block can carry).
A ```py fence, or any other word after ```python, fails the test: every block is accounted for.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(python|py)([^\n]*)\n(.*?)^```", flags=re.S | re.M)
#: named blocks and the test file that runs each
CLAIMED = {
    "pipeline_demo.py": "tests/integration/test_pipeline_docs.py",
    "offload_demo": "tests/integration/test_offload.py",
    "nnsight_doc": "tests/integration/test_nnsight_docs.py",  # nnsight re-reads each block's source from a file
}
#: pages whose blocks load the bundled real models (a few seconds each): run with the slow tests
REAL_MODEL = re.compile(r"from_pretrained\(\s*\"(smollm2-135m|gemma-3-270m|gemma3-270m)\"")


def blocks(page: Path) -> list[tuple[int, str, str]]:
    """`(line, info, code)` for each Python fence of `page`, in order."""
    text = page.read_text()
    found = []
    for match in FENCE.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        fence, info = match.group(1), match.group(2).strip()
        found.append((line, f"{fence} {info}".strip(), match.group(3)))
    return found


def _params():
    params = []
    for page in PAGES:
        runnable = [(line, code) for line, info, code in blocks(page) if info == "python"]
        slow = any(REAL_MODEL.search(code) for _, code in runnable)
        for index, (line, _) in enumerate(runnable):
            marks = [pytest.mark.slow] if slow else []
            params.append(pytest.param(page, index, marks=marks, id=f"{page.relative_to(ROOT)}:{line}"))
    return params


_NAMESPACES: dict[Path, tuple[int, dict]] = {}  # the current page -> (blocks run so far, their namespace)


@pytest.mark.parametrize("page, index", _params())
def test_block_runs(page: Path, index: int, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # blocks that write files write them here
    runnable = [(line, code) for line, info, code in blocks(page) if info == "python"]
    done, namespace = _NAMESPACES.get(page, (0, {}))
    _NAMESPACES.clear()  # one page's models in memory at a time
    if done > index:  # rerun from the top: this block may rely on state a later block changed
        done, namespace = 0, {}
    for line, code in runnable[done : index + 1]:
        exec(compile(code, f"{page.relative_to(ROOT)}:{line}", "exec"), namespace)
        done += 1
        _NAMESPACES[page] = (done, namespace)


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_block_is_run_or_marked(page: Path):
    for line, info, _code in blocks(page):
        where = f"{page.relative_to(ROOT)}:{line}"
        assert info.startswith("python"), f"{where}: fence ```{info}: use ```python (run) or ```python fragment"
        words = info.split()[1:]
        if not words or words == ["fragment"]:
            continue
        assert len(words) == 1 and words[0] in CLAIMED, (
            f"{where}: ```{info} is neither run here nor claimed: use ```python, ```python fragment, "
            f"or add {words[-1]!r} to CLAIMED in {Path(__file__).relative_to(ROOT)} with the test that runs it"
        )
        claimed_by = (ROOT / CLAIMED[words[0]]).read_text()
        assert words[0] in claimed_by, f"{where}: {CLAIMED[words[0]]} no longer runs block {words[0]!r}"


def test_fragments_are_few():
    counts = [info.split()[1:] == ["fragment"] for page in PAGES for _, info, _ in blocks(page)]
    assert sum(counts) <= len(counts) // 3, f"{sum(counts)} of {len(counts)} Python blocks are fragments: make more run"
