"""Every operation's admission estimate bounds the memory it really takes (tests/integration/serve_costs.py):
the peak resident memory of the server subprocess while it answers, over the memory before."""

from __future__ import annotations

import pytest

from tests.integration.serve_abuse import SIZES, Server, make_checkpoint
from tests.integration.serve_costs import CASES, measure

pytestmark = pytest.mark.slow  # a server subprocess and a dozen requests of a few hundred MB


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    checkpoint = make_checkpoint(tmp_path_factory.mktemp("checkpoint"))
    srv = Server(checkpoint, SIZES["test"], tmp_path_factory.mktemp("server"), "--request-timeout", "600")
    yield srv
    srv.stop()


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_the_estimate_bounds_the_peak(server, case):
    measured = measure(server, case, scale=4)
    assert measured.estimate_mib > 0 and measured.peak_mib <= measured.estimate_mib, measured
