"""The documentation site builds strictly (`make docs`): no broken link or anchor, no page outside the nav, and
every code fence of every page renders as a code block (a strict build does not catch a fence that did not)."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


def test_config_turns_every_link_problem_into_a_failure():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    assert config["strict"] is True  # strict mode turns each warning below into a failed build
    validation = config["validation"]
    for key in ("not_found", "anchors", "absolute_links", "unrecognized_links"):
        assert validation["links"][key] == "warn", f"validation.links.{key}"
    for key in ("omitted_files", "not_found"):
        assert validation["nav"][key] == "warn", f"validation.nav.{key}"


def test_every_docs_page_is_in_the_nav():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    listed: set[str] = set()

    def walk(node):
        if isinstance(node, str):
            listed.add(node)
        elif isinstance(node, dict):
            for value in node.values():
                walk(value)
        else:
            for item in node:
                walk(item)

    walk(config["nav"])
    pages = {str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs").rglob("*.md")}
    assert pages == listed, (
        f"in docs/ but not in mkdocs.yml's nav: {sorted(pages - listed)}; missing: {sorted(listed - pages)}"
    )


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site, built strictly once for this module's tests."""
    out = tmp_path_factory.mktemp("docs") / "site"
    mkdocs = Path(sys.executable).with_name("mkdocs")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    done = subprocess.run(
        [str(mkdocs), "build", "--strict", "-q", "-d", str(out)], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return out


@pytest.mark.slow
def test_mkdocs_build_strict(site):
    assert (site / "api" / "hooked_transformer" / "index.html").exists()


FENCE_LINE = re.compile(r"^[ \t]*(```|~~~)", flags=re.M)
INFO_STRING = re.compile(r"^[\w+-]+([ \t]+[\w.-]+)?[ \t]*\n")  # a fence's `bash fragment` line, then content


class FenceScan(HTMLParser):
    """Text of a page by where it sits: prose, inline `<code>`, or a code block (`<pre>`)."""

    def __init__(self):
        super().__init__()
        self.prose, self.inline, self.blocks = [], [], []
        self._pre = self._code = 0

    def handle_starttag(self, tag, attrs):
        self._pre += tag == "pre"
        self._code += tag == "code"

    def handle_endtag(self, tag):
        self._pre -= tag == "pre" and self._pre > 0
        self._code -= tag == "code" and self._code > 0

    def handle_data(self, data):
        (self.blocks if self._pre else self.inline if self._code else self.prose).append(data)


def stray_fences(html: str) -> list[str]:
    """What a fence that did not render leaves in a page: backtick or tilde fences in the prose (a paragraph
    showing them), a fence line inside a code block (the block that swallowed the next one), or an inline code
    span that starts with a fence's info string (Python-Markdown reads an unrendered ```...``` as one span)."""
    scan = FenceScan()
    scan.feed(html)
    found = [f"prose: {t.strip()[:80]!r}" for t in scan.prose if "```" in t or "~~~" in t]
    block_text = "".join(scan.blocks)
    found += [f"code block: {m.group(0)!r}" for m in FENCE_LINE.finditer(block_text)]
    return found + [f"inline code: {t[:80]!r}" for t in scan.inline if INFO_STRING.match(t)]


@pytest.mark.slow
def test_every_built_page_has_no_unrendered_fence(site):
    pages = sorted(site.rglob("*.html"))
    assert len(pages) > 20
    stray = {str(p.relative_to(site)): found for p in pages if (found := stray_fences(p.read_text()))}
    assert not stray, stray
    serving = (site / "serving" / "index.html").read_text()  # the fence the hook once left unrendered
    assert '<span class="filename">fragment</span><pre>' in serving


def test_stray_fence_scan_finds_what_an_unrendered_fence_leaves():
    unrendered = "<p>```bash fragment\nhooked serve\n</p><pre><code>text\n```python\nx = 1</code></pre>"
    assert [f.split(":")[0] for f in stray_fences(unrendered)] == ["prose", "code block"]
    assert stray_fences("<p><code>bash fragment\nhooked serve</code></p>") != []
    rendered = "<p>a <code>```python fragment</code> fence</p><pre><code>x = 1\n</code></pre>"
    assert stray_fences(rendered) == []


def test_docs_hook_titles_every_fence_with_a_word():
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "_hooks.py")
    assert spec is not None and spec.loader is not None
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    page = "```bash fragment\nx\n```\n  ~~~python offload_demo\ny\n  ~~~\n```python fragment\n```text\n```"
    assert hooks.on_page_markdown(page).splitlines() == [
        '```bash title="fragment"', "x", "```", '  ~~~python title="offload_demo"', "y", "  ~~~",
        '```python title="fragment (not run by the tests)"', "```text", "```",
    ]  # fmt: skip
