"""The wire format of `hooked serve`: one safetensors file per request and per response.

A message is a safetensors file whose `__metadata__` holds the JSON body under `"json"`
and whose tensors are the token ids, masks and intervention tensors the JSON refers to by
name. Safetensors is plain data (a JSON header of dtypes, shapes and byte offsets, then raw
bytes), so decoding never unpickles or runs anything. `decode` validates the whole header
against `Limits` (header size, JSON depth, dtype list, shapes, byte counts, offsets) before
a single tensor is allocated, and refuses non-finite floats.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from hooked.core.errors import HookedError, WireError  # noqa: F401  (HookedError: importable from here before)

DTYPES = {  # safetensors name -> (torch dtype, bytes per element): the only ones accepted
    "F32": (torch.float32, 4),
    "F16": (torch.float16, 2),
    "BF16": (torch.bfloat16, 2),
    "F64": (torch.float64, 8),
    "I64": (torch.int64, 8),
    "I32": (torch.int32, 4),
    "I16": (torch.int16, 2),
    "I8": (torch.int8, 1),
    "U8": (torch.uint8, 1),
    "BOOL": (torch.bool, 1),
}
CONTENT_TYPE = "application/vnd.hooked+safetensors"


@dataclass(frozen=True)
class Limits:
    """Bounds on one decoded message (the server's are set by `hooked serve` options)."""

    max_body_bytes: int = 64 * 2**20
    max_header_bytes: int = 2**20
    max_json_depth: int = 12
    max_tensors: int = 256
    max_ndim: int = 6
    max_tensor_elements: int = 2**24


def json_depth(text: str, limit: int) -> None:
    """Raise if JSON `text` nests deeper than `limit` (scanned before parsing, so no recursion blow-up)."""
    depth, in_string, escaped = 0, False, False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > limit:
                raise WireError(f"JSON nests deeper than {limit} levels", 422)
        elif ch in "]}":
            depth -= 1


def _strict_json(text: str, limits: Limits) -> Any:
    json_depth(text, limits.max_json_depth)

    def no_constants(name):  # NaN / Infinity are not JSON
        raise WireError(f"JSON constant {name} is not allowed", 422)

    try:
        return json.loads(text, parse_constant=no_constants)
    except WireError:
        raise
    except ValueError as e:  # JSONDecodeError, or an integer of more digits than Python converts
        raise WireError(f"malformed JSON: {str(e)[:200]}", 400) from None


NAMES = {dtype: name for name, (dtype, _) in DTYPES.items()}  # torch dtype -> safetensors name
CHUNK_BYTES = 2**20  # an answer is sent a slice of this size at a time


class Message:
    """An encoded message not yet written out: its safetensors header, then each tensor's bytes.

    `chunks()` yields it a slice at a time straight from the tensors' memory, so sending an
    answer never holds a second copy of it; `nbytes` is its size before a byte is produced.
    """

    def __init__(self, body: dict, tensors: dict[str, torch.Tensor] | None = None):
        header: dict[str, Any] = {"__metadata__": {"json": json.dumps(body, allow_nan=False)}}
        self.tensors: list[torch.Tensor] = []
        offset = 0
        for name, t in (tensors or {}).items():
            if t.dtype not in NAMES:
                raise WireError(f"tensor {name!r} has dtype {t.dtype}, which the wire format does not carry", 500)
            size = t.numel() * t.element_size()
            header[name] = {"dtype": NAMES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + size]}
            self.tensors.append(t.detach())
            offset += size
        raw = json.dumps(header).encode()
        raw += b" " * (-len(raw) % 8)  # the data starts 8-byte aligned, as safetensors writes it
        self.header = struct.pack("<Q", len(raw)) + raw
        self.nbytes = len(self.header) + offset

    def chunks(self, size: int = CHUNK_BYTES) -> Iterator[bytes]:
        """The message, `size` bytes at a time (a tensor is made contiguous only while it is sent)."""
        yield self.header
        for t in self.tensors:
            if t.numel() == 0:
                continue
            flat = t.cpu().contiguous().reshape(-1).view(torch.uint8).numpy()  # [nbytes], no copy when contiguous
            view = flat.data
            for start in range(0, len(view), size):
                yield bytes(view[start : start + size])

    def to_bytes(self) -> bytes:
        return b"".join(self.chunks())


def encode(body: dict, tensors: dict[str, torch.Tensor] | None = None) -> bytes:
    """`body` (JSON-able) and `tensors` as one safetensors message."""
    return Message(body, tensors).to_bytes()


def _check_header(data: bytes, limits: Limits) -> dict:
    """The safetensors header of `data`, checked: within the limits, strict JSON, tensors tiling the body."""
    n = _header_length(data, limits)
    try:
        text = data[8 : 8 + n].decode("utf-8")
    except UnicodeDecodeError:
        raise WireError("safetensors header is not UTF-8", 400) from None
    header = _strict_json(text, limits)
    if not isinstance(header, dict):
        raise WireError("safetensors header must be a JSON object", 400)
    entries = {k: v for k, v in header.items() if k != "__metadata__"}
    if len(entries) > limits.max_tensors:
        raise WireError(f"{len(entries)} tensors exceed the limit of {limits.max_tensors}", 413)
    spans = []
    for name, entry in entries.items():
        spans.append((*_check_entry(name, entry, limits), name))
    cursor = 0
    for begin, end, name in sorted(spans):
        if begin != cursor:
            raise WireError(f"tensor {name!r}'s bytes overlap or leave a gap (offset {begin}, expected {cursor})", 400)
        cursor = end
    if 8 + n + cursor != len(data):
        raise WireError(f"the tensors cover {cursor} bytes but the body holds {len(data) - 8 - n}", 400)
    return header


def _header_length(data: bytes, limits: Limits) -> int:
    """The header length that the first 8 bytes state, checked against the body and the limits."""
    if len(data) > limits.max_body_bytes:
        raise WireError(f"body of {len(data)} bytes exceeds the limit of {limits.max_body_bytes}", 413)
    if len(data) < 8:
        raise WireError("body is not a safetensors message (shorter than its 8-byte header length)", 400)
    (n,) = struct.unpack("<Q", data[:8])
    if 8 + n > len(data):
        raise WireError(f"not a safetensors message: its header claims {n} bytes, the body has {len(data) - 8}", 400)
    if n > limits.max_header_bytes:
        raise WireError(f"safetensors header of {n} bytes exceeds the limit of {limits.max_header_bytes}", 413)
    return n


def _check_entry(name: str, entry, limits: Limits) -> tuple[int, int]:
    if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
        raise WireError(f"tensor {name!r:.60} needs exactly dtype, shape and data_offsets", 400)
    dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if dtype not in DTYPES:
        raise WireError(f"tensor {name!r:.60} has dtype {dtype!r:.20}; accepted: {sorted(DTYPES)}", 422)

    def ints(xs) -> bool:
        return isinstance(xs, list) and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in xs)

    if not ints(shape) or len(shape) > limits.max_ndim:
        raise WireError(f"tensor {name!r:.60} shape must be at most {limits.max_ndim} non-negative ints", 422)
    if not ints(offsets) or len(offsets) != 2 or offsets[0] > offsets[1]:
        raise WireError(f"tensor {name!r:.60} has bad data_offsets", 400)
    numel = math.prod(shape)
    if numel > limits.max_tensor_elements:
        raise WireError(
            f"tensor {name!r:.60} has {numel} elements, over the limit of {limits.max_tensor_elements}", 413
        )
    if numel * DTYPES[dtype][1] != offsets[1] - offsets[0]:
        raise WireError(
            f"tensor {name!r:.60}: shape {shape} of {dtype} does not match its {offsets[1] - offsets[0]} bytes", 400
        )
    return offsets[0], offsets[1]


def decode(data: bytes, limits: Limits = Limits(), finite: bool = True) -> tuple[dict, dict[str, torch.Tensor]]:
    """(JSON body, tensors) of a message, after checking everything against `limits`; with `finite`
    (requests), float tensors holding NaN or infinities are refused too."""
    header = _check_header(data, limits)
    meta = header.get("__metadata__") or {}
    if not isinstance(meta, dict) or not isinstance(meta.get("json", "{}"), str):
        raise WireError("__metadata__ must hold the JSON body as a string under 'json'", 400)
    body = _strict_json(meta.get("json", "{}"), limits)
    if not isinstance(body, dict):
        raise WireError("the JSON body must be an object", 422)
    from safetensors.torch import load

    try:
        tensors = load(bytes(data))
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as e:  # noqa: BLE001 - the Rust loader panics with a BaseException: a malformed body
        raise WireError(f"unreadable safetensors body: {type(e).__name__}", 400) from None
    for name, t in tensors.items() if finite else ():
        if t.is_floating_point() and t.numel() and not bool(torch.isfinite(t).all()):
            raise WireError(f"tensor {name!r:.60} holds NaN or infinite values", 422)
    return body, tensors
