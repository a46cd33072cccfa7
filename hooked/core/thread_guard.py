"""One thread at a time per model: concurrent use is detected and refused, never silently mixed.

A model's hooks and its `forward_state` (mask, positions, step of the running call)
live on the model, so two threads running one model at once would see each other's
hooks and overwrite each other's state. Rather than let results be silently wrong,
a thread that enters a model (a forward, a `hooks()` context, `run_with_hooks`,
`run_with_cache`, `generate`, `add_hook`, `reset_hooks`) while another thread is inside it gets a
`ConcurrentUseError`. The same thread may re-enter freely (hooks calling the model,
nested contexts). Use one model per thread (`copy.deepcopy(model)`) or a lock.

The claim is kept in a module-level weak map, not on the model, so copies and pickles
of a model never inherit it. Inside a `torch.compile`d region the guard steps aside
(dynamo cannot trace `threading.get_ident`, and a thread id has no place in a graph):
concurrent calls of a compiled model are not detected, so give each thread its own copy.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Iterator

import torch

from hooked.core.errors import ConcurrentUseError

_LOCK = threading.Lock()
_CLAIMS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> [thread id, depth]


@contextlib.contextmanager
def exclusive(model) -> Iterator[None]:
    """Hold `model` for the current thread; raise `ConcurrentUseError` if another thread holds it."""
    if torch.compiler.is_compiling():  # being traced: no thread ids in a graph
        yield
        return
    me = threading.get_ident()
    with _LOCK:
        claim = _CLAIMS.get(model)
        if claim is None:
            _CLAIMS[model] = claim = [me, 0]
        elif claim[0] != me:
            raise ConcurrentUseError(
                f"{type(model).__name__} is already running in another thread: a model's hooks and forward_state "
                "are shared, so concurrent calls would mix. Use one model per thread (copy.deepcopy(model)) "
                "or serialise the calls with a lock."
            )
        claim[1] += 1
    try:
        yield
    finally:
        with _LOCK:
            claim[1] -= 1
            if claim[1] == 0:
                del _CLAIMS[model]
