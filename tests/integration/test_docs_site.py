"""The documentation site builds strictly (`make docs`): no broken link or anchor, no page outside the nav."""

from __future__ import annotations

import os
import subprocess
import sys
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


@pytest.mark.slow
def test_mkdocs_build_strict(tmp_path):
    mkdocs = Path(sys.executable).with_name("mkdocs")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    done = subprocess.run(
        [str(mkdocs), "build", "--strict", "-q", "-d", str(tmp_path / "site")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert (tmp_path / "site" / "api" / "hooked_transformer" / "index.html").exists()
