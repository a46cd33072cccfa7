"""Tokens and sessions (hooked/serve/auth.py): what a tokens file may hold, and who a request is."""

from __future__ import annotations

import logging

import pytest

from hooked.core.errors import HookedError, WireError
from hooked.serve import auth


class FakeRequest:
    def __init__(self, headers=None, cookies=None):
        self.headers, self.cookies = headers or {}, cookies or {}


TOKENS = {"alice": "alice-token-0123456789", "bob": "bob-token-0123456789ab"}


@pytest.mark.parametrize(
    "text,match",
    [
        ("alice short", "shorter than 16 characters"),
        ("alice a-token-0123456789\nalice b-token-0123456789", "appears twice"),
        ("alice same-token-0123456789\nbob same-token-0123456789", "same token as 'alice'"),
        ("alice one two", "expected 'user token'"),
        ("al/ice a-token-0123456789", "user names"),
    ],
)
def test_bad_tokens_files_are_refused(text, match):
    with pytest.raises(HookedError, match=match):
        auth.parse_tokens(text)


def test_tokens_file_readable_by_others_draws_a_warning(tmp_path, caplog):
    path = tmp_path / "tokens.txt"
    path.write_text("alice alice-token-0123456789\n# a comment\n\nbob bob-token-0123456789ab\n")
    path.chmod(0o600)
    with caplog.at_level(logging.WARNING, logger="hooked.serve"):
        assert auth.read_tokens_file(str(path)) == TOKENS
    assert not caplog.records
    path.chmod(0o644)
    with caplog.at_level(logging.WARNING, logger="hooked.serve"):
        auth.read_tokens_file(str(path))
    assert "readable by everyone" in caplog.text and "chmod 600" in caplog.text


def test_bearer_tokens_and_sessions():
    a = auth.Auth(TOKENS)
    assert a.user(FakeRequest({"authorization": f"Bearer {TOKENS['bob']}"})) == "bob"
    for headers in ({}, {"authorization": "Bearer nope-nope-nope-nope"}, {"authorization": f"Basic {TOKENS['bob']}"}):
        with pytest.raises(WireError) as e:
            a.user(FakeRequest(headers))
        assert e.value.status == 401
    session = a.start_session("alice")
    browser = FakeRequest(cookies={auth.COOKIE: session})
    assert a.user(browser, cookie=True) == "alice"
    with pytest.raises(WireError):
        a.user(browser)  # the API routes take no cookie
    a.end_session(session)
    with pytest.raises(WireError):
        a.user(browser, cookie=True)
    assert auth.Auth(None).user(FakeRequest()) == "local"  # no tokens: loopback only, no auth
