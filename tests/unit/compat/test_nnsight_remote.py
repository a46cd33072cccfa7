"""nnsight runs `hooked` models locally: `remote=True` and a `hooked.remote.RemoteModel` are refused with an
error that names `hooked.remote`, interventions and the docs page; `remote=False` (ARENA's `remote=REMOTE`)
traces locally as before."""

from __future__ import annotations

import pytest
import torch

from hooked import remote
from hooked.compat.nnsight import REMOTE_DOCS, HookedNNsight
from hooked.core.errors import InputError, InputTypeError
from hooked.serve import start_in_thread
from tests.tiny_models import tiny_hooked

TOKENS = torch.randint(0, 50, (1, 5), generator=torch.Generator().manual_seed(0))
POINTS_THE_WAY = ("runs hooked models locally", "hooked.remote.connect", "interventions", REMOTE_DOCS)


@pytest.fixture(scope="module")
def nm():
    return HookedNNsight(tiny_hooked("gpt2").eval())


@pytest.mark.parametrize(
    "open_block",
    [
        lambda nm: nm.trace(TOKENS, remote=True),
        lambda nm: nm.generate(TOKENS, max_new_tokens=2, stop_at_eos=False, remote=True),
        lambda nm: nm.session(remote=True),
        lambda nm: nm.trace(TOKENS, remote="local"),  # nnsight's serialising dry run of the remote path
    ],
    ids=["trace", "generate", "session", "local-simulation"],
)
def test_remote_true_names_hooked_remote_and_the_docs(nm, open_block):
    with pytest.raises(InputError) as error, open_block(nm):
        pass
    message = str(error.value)
    assert "remote=" in message and all(part in message for part in POINTS_THE_WAY), message


def test_remote_false_traces_locally_as_before(nm):
    with torch.no_grad(), nm.trace(TOKENS, remote=False):
        logits = nm.unembed.output.save()
    with torch.no_grad(), nm.generate(TOKENS, max_new_tokens=2, stop_at_eos=False, remote=False) as tracer:
        ids = tracer.result.save()
    model = nm._module
    assert torch.equal(logits, model(TOKENS))
    assert torch.equal(ids, model.generate(TOKENS, max_new_tokens=2, stop_at_eos=False, do_sample=False))


# a checker limit: the client builds its config from the server's JSON, where dtype is a string that
# HookedTransformerConfig converts, but its annotation says torch.dtype
@pytest.mark.unchecked
def test_wrapping_a_remote_model_names_hooked_remote_and_the_docs():
    token = "alice-0123456789abcdef"
    with start_in_thread(tiny_hooked("gpt2"), tokens={"alice": token}) as server:
        client = remote.connect(server.url, token=token)
        try:
            with pytest.raises(InputTypeError) as error:
                HookedNNsight(client)
        finally:
            client.close()
    message = str(error.value)
    assert "HookedNNsight(remote model)" in message and all(part in message for part in POINTS_THE_WAY), message
    with pytest.raises(InputTypeError, match="wraps a HookedTransformer"):
        HookedNNsight("gpt2")
