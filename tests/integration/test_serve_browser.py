"""`hooked serve`'s pages in a real headless Chromium (Playwright): the status page at `/` and the
`/inspect` page running `hooked inspect --html`'s views for a prompt, fetched with a bearer token."""

from __future__ import annotations

import os
import shutil

import pytest

from hooked import HookedTransformer, remote
from hooked.serve import start_in_thread
from tests.integration.serve_models import TOKENS, save_tiny

BROWSER = os.environ.get("HOOKED_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
try:
    from playwright.sync_api import sync_playwright
except ImportError:  # pragma: no cover - depends on the machine
    sync_playwright = None
if BROWSER is None or sync_playwright is None:
    pytest.skip("the browser tests need Chromium and Playwright: apt-get install chromium", allow_module_level=True)

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    model = HookedTransformer.from_pretrained(str(save_tiny("gpt2", tmp_path_factory.mktemp("gpt2"))))
    with start_in_thread(model, tokens=TOKENS) as srv:
        with remote.connect(srv.url, token=TOKENS["bob"]) as bob:
            bob("The quick brown fox")  # one request for the status page to count
        yield srv


@pytest.fixture(scope="module")
def browser():
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=BROWSER, headless=True, args=["--no-sandbox"], timeout=60_000)
        yield b
        b.close()


def _open(browser, url: str, headers: dict | None = None):
    context = browser.new_context(viewport={"width": 1200, "height": 900}, extra_http_headers=headers or {})
    page = context.new_page()
    errors = []
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    response = page.goto(url, timeout=60_000)
    return context, page, response, errors


def test_status_page_shows_model_queue_and_users(browser, server, tmp_path):
    context, page, response, errors = _open(browser, server.url + "/")
    assert response.status == 200
    assert "Model:" in page.inner_text("#model") and "Queued: 0" in page.inner_text("#queue")
    rows = page.inner_text("#users")
    assert "bob" in rows and "alice" not in rows  # only users who sent requests; no tokens anywhere
    assert TOKENS["bob"] not in page.content()
    page.screenshot(path=str(tmp_path / "status.png"))
    assert (tmp_path / "status.png").read_bytes().startswith(PNG) and errors == []
    context.close()


def test_inspect_page_runs_the_prompt_views(browser, server, tmp_path):
    context, page, response, _ = _open(browser, server.url + "/inspect?prompt=The%20quick%20brown%20fox")
    assert response.status == 401  # no token: refused
    context.close()
    headers = {"authorization": f"Bearer {TOKENS['alice']}"}
    context, page, response, errors = _open(browser, server.url + "/inspect?prompt=The%20quick%20brown%20fox", headers)
    assert response.status == 200
    page.wait_for_selector("section", timeout=30_000)
    kinds = page.eval_on_selector_all("section", "els => els.map(e => e.dataset.kind)")
    assert {"logit_lens", "attention"} <= set(kinds), kinds
    assert "fox" in page.inner_text("body")
    page.screenshot(path=str(tmp_path / "inspect.png"), full_page=True)
    assert (tmp_path / "inspect.png").read_bytes().startswith(PNG) and errors == [], errors
    context.close()
