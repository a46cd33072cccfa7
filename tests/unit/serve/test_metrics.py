"""hooked.analysis.metrics: each declared metric equals its hand-written formula and survives its spec round trip."""

from __future__ import annotations

import pytest
import torch

from hooked.analysis import metrics
from hooked.core.errors import HookedError, InputError
from hooked.serve.app import parse_tokens

LOGITS = torch.randn(3, 5, 11, generator=torch.Generator().manual_seed(0))


def test_logit_diff():
    m = metrics.logit_diff([2, 3], [7], pos=-2)
    expected = (LOGITS[:, -2, [2, 3]].mean(-1) - LOGITS[:, -2, 7]).mean()
    torch.testing.assert_close(m(LOGITS), expected)
    assert torch.equal(metrics.from_spec(*m.to_spec())(LOGITS), m(LOGITS))


def test_log_prob():
    m = metrics.log_prob(4)
    expected = LOGITS[:, -1].log_softmax(-1)[:, 4].mean()
    torch.testing.assert_close(m(LOGITS), expected)
    assert torch.equal(metrics.from_spec(*m.to_spec())(LOGITS), m(LOGITS))


def test_projection():
    d = torch.randn(11)
    m = metrics.projection(d, pos=1)
    torch.testing.assert_close(m(LOGITS), (LOGITS[:, 1] @ d).mean())
    assert torch.equal(metrics.from_spec(*m.to_spec())(LOGITS), m(LOGITS))


@pytest.mark.parametrize(
    "spec",
    [
        {"op": "eval", "x": "1"},
        {"op": "log_prob", "token": "1"},
        {"op": "logit_diff", "correct": [], "incorrect": [1]},
        {"op": "projection", "direction": "missing"},
        ["log_prob"],
    ],
)
@pytest.mark.unchecked  # a wrongly typed argument on purpose: the library's own error, which the checks would preempt
def test_bad_specs_are_refused(spec):
    with pytest.raises(InputError):
        metrics.from_spec(spec, {})


def test_token_file_parsing():
    assert parse_tokens("# course\nalice 0123456789abcdef0\n\nbob fedcba98765432100") == {
        "alice": "0123456789abcdef0",
        "bob": "fedcba98765432100",
    }
    for bad in (
        "alice short",
        "alice 0123456789abcdef0 extra",
        "a/b 0123456789abcdef0",
        "alice 0123456789abcdef0\nalice 0123456789abcdef1",
    ):
        with pytest.raises(HookedError, match="tokens line"):
            parse_tokens(bad)


def test_resolve_tokens_loopback_and_public_addresses():
    from hooked.serve import resolve_tokens

    given = {"alice": "0123456789abcdef0"}
    assert resolve_tokens("0.0.0.0", given) == (given, None)
    tokens, generated = resolve_tokens("127.0.0.1", None)
    assert tokens == {"local": generated} and len(generated) >= 24  # a one-time token, printed by the CLI
    assert resolve_tokens("::1", None, no_auth=True) == (None, None)
    for host in ("0.0.0.0", "192.168.1.5", "example.org"):
        with pytest.raises(InputError, match="without authentication"):
            resolve_tokens(host, None, no_auth=True)
