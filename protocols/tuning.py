"""Process-level tuning shared by the server and the client.

Tensor chunks arrive as 1 MiB buffers.  glibc serves allocations of that size
with mmap and returns them with munmap, so every chunk costs page faults and
zeroing in the kernel: measured here, a 10-client round of a 10 M-parameter
model spent about as much CPU time in the kernel as in user space.  Raising the
mmap threshold keeps such buffers on the heap, where they are reused.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
#: Buffers below this size come from the heap (glibc caps the value at 32 MiB).
MMAP_THRESHOLD = 32 << 20
#: Free heap memory above this is returned to the kernel.
TRIM_THRESHOLD = 128 << 20


def tune_allocator() -> bool:
    """Apply the thresholds on glibc; a no-op (False) elsewhere."""
    if not sys.platform.startswith("linux"):
        return False
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    ok = mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
    return bool(ok and mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1)


__all__ = ["MMAP_THRESHOLD", "TRIM_THRESHOLD", "tune_allocator"]
