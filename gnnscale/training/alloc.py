"""Keep freed per-batch tensors in the heap instead of handing them back to the kernel.

glibc serves allocations above M_MMAP_THRESHOLD with fresh mmaps and trims the heap top on
free, so every mini-batch's activations (tens of MB) are page-faulted in anew; on the 500k-node
benchmark that is several ms per step. Raising both thresholds lets the next batch reuse the
pages. Process-local, glibc-only: a no-op elsewhere.
"""

from __future__ import annotations

import ctypes
import ctypes.util

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_done = False


def keep_heap_warm(mmap_threshold: int = 32 << 20, trim_threshold: int = 1 << 30) -> bool:
    global _done
    if _done:
        return True
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        ok = bool(libc.mallopt(_M_MMAP_THRESHOLD, mmap_threshold)) and bool(
            libc.mallopt(_M_TRIM_THRESHOLD, trim_threshold)
        )
    except (OSError, AttributeError):
        return False
    _done = ok
    return ok
