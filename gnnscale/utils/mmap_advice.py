"""Access-pattern advice for memory-mapped files (madvise), by the address range of a tensor or array.

Training reads features and CSC rows at random. With the default advice a page fault on a file mapping
reads ahead around the faulting page (read_ahead_kb, several MB on some disks): when the files fit in
the page cache that only warms it faster, but with less page cache than the files need every 512-byte
row costs megabytes of reads that are evicted before they are used (measured in
scripts/bench_outofcore.py). MADV_RANDOM makes a fault read its own page only.
"""

from __future__ import annotations

import ctypes
import mmap

ADVICE = {
    "normal": getattr(mmap, "MADV_NORMAL", 0),
    "random": getattr(mmap, "MADV_RANDOM", 1),
    "sequential": getattr(mmap, "MADV_SEQUENTIAL", 2),
}
_PAGE = mmap.PAGESIZE
_libc = None


def advise(address: int, nbytes: int, how: str) -> bool:
    """madvise the pages spanning [address, address + nbytes); False where it is not available or
    refused (advice only: nothing depends on it but speed)."""
    global _libc
    if nbytes <= 0 or address == 0:
        return False
    try:
        if _libc is None:
            _libc = ctypes.CDLL(None, use_errno=True)
            _libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
        start = address - address % _PAGE
        return _libc.madvise(start, address + nbytes - start, ADVICE[how]) == 0
    except (OSError, AttributeError):
        return False


def advise_tensor(t, how: str) -> bool:
    """For a torch tensor (or a numpy array) backed by a file mapping."""
    if hasattr(t, "untyped_storage"):
        storage = t.untyped_storage()
        return advise(storage.data_ptr(), storage.nbytes(), how)
    return advise(t.ctypes.data, t.nbytes, how)
