"""`hooked serve`'s pages in a real headless Chromium (Playwright): the status page at `/` and the
`/inspect` page running `hooked inspect --html`'s views for a prompt, fetched with a bearer token."""

from __future__ import annotations

import pytest

from hooked import HookedTransformer, remote
from hooked.serve import start_in_thread
from tests.integration.browser import check_screenshot, open_page, require_browser
from tests.integration.serve_models import TOKENS, save_tiny

require_browser()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    model = HookedTransformer.from_pretrained(str(save_tiny("gpt2", tmp_path_factory.mktemp("gpt2"))))
    with start_in_thread(model, tokens=TOKENS) as srv:
        with remote.connect(srv.url, token=TOKENS["bob"]) as bob:
            bob("The quick brown fox")  # one request for the status page to count
        yield srv


def test_status_page_shows_model_queue_and_users(browser, server, tmp_path):
    page, response, errors, _ = open_page(browser, server.url + "/", wait_for=None)
    assert response.status == 200
    assert "Model:" in page.inner_text("#model") and "Queued: 0" in page.inner_text("#queue")
    rows = page.inner_text("#users")
    assert "bob" in rows and "alice" not in rows  # only users who sent requests; no tokens anywhere
    assert TOKENS["bob"] not in page.content()
    check_screenshot(page, tmp_path / "status.png")
    assert errors == [], errors
    page.context.close()


def test_inspect_page_runs_the_prompt_views(browser, server, tmp_path):
    page, response, _, _ = open_page(browser, server.url + "/inspect?prompt=The%20quick%20brown%20fox", wait_for=None)
    assert response.status == 401  # no token: refused
    page.context.close()
    headers = {"authorization": f"Bearer {TOKENS['alice']}"}
    page, response, errors, _ = open_page(
        browser, server.url + "/inspect?prompt=The%20quick%20brown%20fox", headers=headers, wait_for=None
    )
    assert response.status == 200
    page.wait_for_selector("section", timeout=30_000)
    kinds = page.eval_on_selector_all("section", "els => els.map(e => e.dataset.kind)")
    assert {"logit_lens", "attention"} <= set(kinds), kinds
    assert "fox" in page.inner_text("body")
    check_screenshot(page, tmp_path / "inspect.png")
    assert errors == [], errors
    page.context.close()
