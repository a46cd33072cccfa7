"""A client imports no server: `hooked.remote` shares the message format, not Starlette or uvicorn."""

from __future__ import annotations

import subprocess
import sys

SERVER_STACK = ("starlette", "uvicorn")


def _loaded_after(statement: str) -> list[str]:
    code = f"import sys\n{statement}\nprint(','.join(m for m in {SERVER_STACK!r} if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return [name for name in done.stdout.strip().split(",") if name]


def test_the_remote_client_loads_no_server_stack():
    assert _loaded_after("import hooked.remote; from hooked.remote import connect") == []


def test_the_server_names_still_import_from_the_package():
    assert _loaded_after("from hooked.serve import ServeOptions, start_in_thread") == list(SERVER_STACK)
