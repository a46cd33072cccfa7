"""How the browser tests drive the distribution's Chromium through Playwright: one launch, one page opener.

`require_browser()` skips a test module (with the install command) where Chromium or Playwright is
missing; the `browser` fixture (tests/integration/conftest.py) launches Chromium once per module.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

INSTALL = "apt-get install chromium && pip install 'playwright==1.65.2'"
BROWSER = os.environ.get("HOOKED_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
PNG = b"\x89PNG\r\n\x1a\n"
VIEWPORT = {"width": 1200, "height": 900}


def _sync_playwright():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:  # pragma: no cover - depends on the machine
        return None
    return sync_playwright


def require_browser() -> None:
    """Skip the calling test module where Chromium or Playwright is not installed, naming the fix."""
    if BROWSER is None or _sync_playwright() is None:
        pytest.skip(f"the browser tests need Chromium and Playwright: {INSTALL}", allow_module_level=True)


@contextmanager
def launch() -> Iterator:
    """A headless Chromium (Playwright `Browser`), closed on exit."""
    with _sync_playwright()() as p:
        browser = p.chromium.launch(executable_path=BROWSER, headless=True, args=["--no-sandbox"], timeout=60_000)
        try:
            yield browser
        finally:
            browser.close()


def open_page(
    browser, url: str, *, headers: dict | None = None, wait_for: str | None = "section", timeout: int = 60_000
):
    """Open `url` in a new page: `(page, response, errors, requests)`; `errors` collects console errors and
    uncaught exceptions, `requests` every URL the page asked for (an offline page asks only for itself)."""
    context = browser.new_context(viewport=VIEWPORT, extra_http_headers=headers or {})
    page = context.new_page()
    errors, requests = [], []
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("request", lambda req: requests.append(req.url))
    response = page.goto(url, timeout=timeout)
    if wait_for:
        page.wait_for_selector(wait_for, timeout=timeout)
    return page, response, errors, requests


def file_url(path: Path) -> str:
    return path.resolve().as_uri()


def check_screenshot(page, png: Path) -> None:
    """A full-page PNG of `page` that is not empty."""
    page.screenshot(path=str(png), full_page=True)
    assert png.read_bytes().startswith(PNG) and png.stat().st_size > 2000, png
