"""Fixtures of the integration tests."""

from __future__ import annotations

import pytest

from tests.integration.browser import launch


@pytest.fixture(scope="module")
def browser():
    """Chromium for the browser tests, once per module (modules call `require_browser()` first)."""
    with launch() as b:
        yield b
