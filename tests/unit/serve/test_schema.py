"""The request schema (hooked/serve/schema.py): one definition read by the client and the server,
and the wire format's streamed encoder (hooked/serve/wire.py)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from safetensors.torch import load

from hooked.core.errors import WireError
from hooked.generation.options import GenerationOptions
from hooked.serve import schema, wire
from hooked.serve.answers import base64_line

#: GenerationOptions fields a client keeps (text handling, progress) or sends in another form.
CLIENT_SIDE = {"prepend_bos", "padding_side", "return_type", "verbose", "fwd_hooks", "names_filter"}


def test_every_generation_option_is_placed():
    """A new GenerationOptions field must be given a place: on the wire, refused remotely, or client-side."""
    placed = set(schema.GENERATION_FIELDS) | set(schema.LOCAL_ONLY_GENERATION) | CLIENT_SIDE
    assert {f.name for f in dataclasses.fields(GenerationOptions)} == placed
    assert not set(schema.GENERATION_FIELDS) & set(schema.LOCAL_ONLY_GENERATION)


def test_generation_fields_take_the_options_defaults_and_types():
    fields = {f.name: f for f in schema.GENERATE.fields}
    for f in dataclasses.fields(GenerationOptions):
        if f.name in schema.GENERATION_FIELDS:
            assert fields[f.name].default == f.default, f.name
    assert fields["temperature"].kinds == (int, float) and fields["seed"].kinds == (int,)
    assert fields["eos_token_id"].kinds == (int, list)


def test_client_body_drops_defaults_and_server_read_fills_them():
    body = schema.GENERATE.body(max_new_tokens=5, do_sample=True, seed=3, hooks=[])
    assert body == {"op": "generate", "max_new_tokens": 5, "seed": 3}
    values = schema.GENERATE.read(body)
    assert values["do_sample"] is True and values["temperature"] == 1.0 and values["names_filter"] is None


@pytest.mark.parametrize(
    "body,match",
    [
        ({"op": "generate", "bogus": 1}, "unknown field"),
        ({"op": "generate", "temperature": "hot"}, "must be int or float"),
        ({"op": "generate", "do_sample": 1}, "must be bool"),
        ({"op": "generate", "max_new_tokens": True}, "must be int"),
        ({"op": "generate", "top_p": 2.0}, "outside"),
        ({"op": "attribution", "names": [], "metric": {}, "steps": 999}, "outside"),
        ({"op": "patch"}, "missing field 'metric'"),
    ],
)
def test_server_read_refuses_with_422(body, match):
    with pytest.raises(WireError, match=match) as e:
        schema.op_of(body).read(body)
    assert e.value.status == 422


def test_server_bounds_override_the_schema():
    with pytest.raises(WireError, match=r"outside \[1, 4\]"):
        schema.GENERATE.read({"op": "generate", "max_new_tokens": 5}, {"max_new_tokens": (1, 4)})


def test_unknown_ops_and_tensor_names():
    for op in ("subprocess.run", ["forward"], None):
        with pytest.raises(WireError, match="unknown op"):
            schema.op_of({"op": op})
    schema.check_tensor_names({"tokens": 0, "h0.1.2": 0, "metric.direction": 0, "clean_attention_mask": 0})
    with pytest.raises(WireError, match="unexpected tensor"):
        schema.check_tensor_names({"tokens": 0, "__reduce__": 0})


def test_streamed_message_is_a_safetensors_file():
    tensors = {
        "a": torch.randn(3, 5),
        "b": torch.arange(7),
        "c": torch.ones(2, dtype=torch.bfloat16),
        "d": torch.tensor(True),
        "e": torch.randn(4, 3).t(),  # not contiguous
        "f": torch.zeros(0, 2),
    }
    message = wire.Message({"x": [1, 2]}, tensors)
    chunks = list(message.chunks(size=7))
    data = b"".join(chunks)
    assert len(data) == message.nbytes and max(len(c) for c in chunks[1:]) <= 7
    body, decoded = wire.decode(data)
    assert body == {"x": [1, 2]}
    assert all(torch.equal(decoded[k], t) for k, t in tensors.items())
    assert set(load(data)) == set(tensors)  # the reference reader agrees


def test_base64_line_of_chunks_equals_base64_of_the_whole():
    import base64
    import json

    data = bytes(range(256)) * 5
    for size in (1, 2, 3, 4, 7, 300):
        line = b"".join(base64_line("result", (data[i : i + size] for i in range(0, len(data), size))))
        assert base64.b64decode(json.loads(line)["result"]) == data
