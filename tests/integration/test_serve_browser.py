"""`hooked serve`'s pages in a real headless Chromium (Playwright): the status page at `/` (counts
without a login, users after it), the login form, and the `/inspect` page running `hooked inspect
--html`'s views for a prompt, reached through the login form or with a bearer token."""

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


def _log_in(page, token: str) -> None:
    page.fill("input[name=token]", token)
    page.click("form[action='/login'] button")


def test_status_page_shows_counts_then_users_after_login(browser, server, tmp_path):
    page, response, errors, _ = open_page(browser, server.url + "/", wait_for=None)
    assert response.status == 200
    assert "Queued: 0" in page.inner_text("#queue") and "users with requests: 1" in page.inner_text("#queue")
    assert "bob" not in page.content() and "Model:" not in page.content()  # no names, no model path
    page.click("text=Log in")
    _log_in(page, TOKENS["alice"])
    page.wait_for_selector("#users")
    rows = page.inner_text("#users")
    assert "bob" in rows and "alice" not in rows  # only users who sent requests; no tokens anywhere
    assert "Model:" in page.inner_text("#model")
    assert TOKENS["alice"] not in page.content() and TOKENS["alice"] not in page.url
    cookie = next(c for c in page.context.cookies() if c["name"] == "hooked_session")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and cookie["value"] != TOKENS["alice"]
    check_screenshot(page, tmp_path / "status.png")
    assert errors == [], errors
    page.context.close()


def test_inspect_page_opens_after_the_login_form(browser, server, tmp_path):
    page, response, _, _ = open_page(browser, server.url + "/inspect?prompt=The%20quick%20brown%20fox", wait_for=None)
    assert response.status == 200 and "/login" in page.url  # no session: the login form, then back
    _log_in(page, "not-a-token-0123456789")
    page.wait_for_selector("#error")
    _log_in(page, TOKENS["alice"])
    page.wait_for_selector("section", timeout=30_000)
    assert page.url.startswith(server.url + "/inspect?prompt=") and TOKENS["alice"] not in page.url
    kinds = page.eval_on_selector_all("section", "els => els.map(e => e.dataset.kind)")
    assert {"logit_lens", "attention"} <= set(kinds), kinds
    assert "fox" in page.inner_text("body")
    check_screenshot(page, tmp_path / "inspect.png")
    page.context.close()


def test_inspect_page_with_a_bearer_token(browser, server):
    headers = {"authorization": f"Bearer {TOKENS['bob']}"}
    page, response, errors, _ = open_page(
        browser, server.url + "/inspect?prompt=The%20quick%20brown%20fox", headers=headers, wait_for="section"
    )
    assert response.status == 200 and errors == [], errors
    page.context.close()
