"""The hostile-client suite (tests/integration/serve_abuse.py) at its test size: every probe of
issue #40 against `hooked serve` in a subprocess under an address-space cap of 6 GB and a limit
of 1,024 open files, bound to 127.0.0.1. Each probe must get a 4xx naming the limit (or a correct
answer), and the server must be alive and answering `/health` after it."""

from __future__ import annotations

import pytest

from tests.integration.serve_abuse import PROBES, SIZES, Server, make_checkpoint, run_probe

pytestmark = pytest.mark.slow  # one server subprocess, real-time deadlines: about 45 s in all
SIZE = SIZES["test"]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    checkpoint = make_checkpoint(tmp_path_factory.mktemp("checkpoint"))
    srv = Server(checkpoint, SIZE, tmp_path_factory.mktemp("server"))
    yield srv
    srv.stop()


@pytest.mark.parametrize("name", list(PROBES))
def test_probe(server, name):
    finding = run_probe(server, SIZE, name)
    assert finding.ok, finding
    assert finding.alive, f"after {name} the server is dead or /health does not answer"
