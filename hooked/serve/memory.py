"""The server's memory as the operating system sees it: what is left to spend, and giving back
what was freed.

`headroom_bytes()` is what this process may still allocate: the smaller of the machine's
available memory and what its address-space limit (`ulimit -v`) leaves, measured after the
model is loaded; the default per-request budgets of `hooked serve` are fractions of it.
`map_large_blocks()` makes glibc map every block of `LARGE_BLOCK` bytes or more on its own and
unmap it when freed (by default glibc raises that threshold as large blocks are freed, so
tensors of up to 32 MiB end up in its heap, where freed memory stays resident and a request's
peak depends on what ran before it); `release()` returns the freed heap memory that remains
(`malloc_trim`). Together they keep the server's resident memory close to what is alive.
`rss_bytes`, `peak_rss_bytes` and `reset_peak` read a process's resident set from `/proc` (Linux),
which is how the estimates of `hooked.serve.costs` are checked against what a request really took.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import os
import resource
from pathlib import Path

logger = logging.getLogger("hooked.serve")


@functools.cache
def _libc():
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        libc.malloc_trim  # noqa: B018 - only glibc has it
    except (OSError, AttributeError):
        return None
    return libc


#: Blocks this large or larger are mapped on their own (`map_large_blocks`).
LARGE_BLOCK = 4 * 2**20
M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter


def map_large_blocks(threshold: int = LARGE_BLOCK) -> bool:
    """Map blocks of `threshold` bytes or more on their own (glibc); False where the platform cannot."""
    libc = _libc()
    if libc is None:
        return False
    return bool(libc.mallopt(M_MMAP_THRESHOLD, threshold))


def release() -> bool:
    """Give freed heap memory back to the operating system; False where the platform cannot."""
    libc = _libc()
    if libc is None:
        return False
    libc.malloc_trim(0)
    return True


def _status(pid: int | str, key: str) -> int | None:
    """A `VmXxx` line of `/proc/<pid>/status`, in bytes (None off Linux)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def rss_bytes(pid: int | str = "self") -> int | None:
    """Resident memory of process `pid` now."""
    return _status(pid, "VmRSS")


def peak_rss_bytes(pid: int | str = "self") -> int | None:
    """The most resident memory of process `pid` since it started or since `reset_peak(pid)`."""
    return _status(pid, "VmHWM")


def reset_peak(pid: int | str = "self") -> bool:
    """Restart `peak_rss_bytes` from the current resident set (Linux 4.0+)."""
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def _available_bytes() -> int:
    """The machine's available memory (`MemAvailable`), or all of it where that is unknown."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def headroom_bytes() -> int:
    """What this process may still allocate: available memory, or less under an address-space limit."""
    headroom = _available_bytes()
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    size = _status("self", "VmSize")
    if soft != resource.RLIM_INFINITY and size is not None:
        headroom = min(headroom, max(0, soft - size))
    return headroom


__all__ = ["headroom_bytes", "map_large_blocks", "peak_rss_bytes", "release", "reset_peak", "rss_bytes"]
