"""Memory meters. RssAnon is heap the kernel cannot reclaim; mmap'd page cache is not counted there.

A reading that cannot be taken (no /proc, a field the kernel lacks) is None, never 0: a peak of 0 MB
would pass every memory target without measuring anything.
"""

from __future__ import annotations

import resource
import threading
import time


def status_kb(field: str, path: str = "/proc/self/status") -> int | None:
    """A kB field of a /proc status file (this process's by default); None when it cannot be read."""
    try:
        with open(path) as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def rss_anon_mb() -> float | None:
    kb = status_kb("RssAnon")
    return None if kb is None else kb / 1024.0


def rss_mb() -> float | None:
    kb = status_kb("VmRSS")
    return None if kb is None else kb / 1024.0


def measured_mb(value: float | None, what: str) -> float:
    """`value`, or a RuntimeError when it could not be read: for benchmarks, which must not pass on it."""
    if value is None:
        raise RuntimeError(
            f"{what} could not be read (/proc/self/status is unreadable or lacks the field): "
            "a memory target cannot be judged without it; run the benchmark on Linux with /proc mounted"
        )
    return value


def peak_rss_mb() -> float:
    """Peak resident set of this process since it started (ru_maxrss, KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


class Poller:
    """Calls _sample() once on entry, every interval_s in a background thread, and once on exit."""

    def __init__(self, interval_s: float):
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _sample(self) -> bool:
        """One reading; False stops the polling (nothing more to read)."""
        raise NotImplementedError

    def _loop(self) -> None:
        while not self._stop.is_set() and self._sample() is not False:
            time.sleep(self.interval_s)

    def __enter__(self):
        if self._sample() is not False:
            self._thread = threading.Thread(target=self._loop, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._sample()


class MemorySampler(Poller):
    """Samples RssAnon and VmRSS in a background thread; the peaks are what a stage must stay under."""

    def __init__(self, interval_s: float = 0.05):
        super().__init__(interval_s)
        # None until a reading succeeds, and None again for good after one fails: a peak over only
        # some of the samples could be below the real one.
        self.peak_anon_mb: float | None = None
        self.peak_rss_mb: float | None = None
        self._failed = {"anon": False, "rss": False}

    def _peak(self, key: str, peak: float | None, value: float | None) -> float | None:
        if value is None:
            self._failed[key] = True
        if self._failed[key]:
            return None
        return value if peak is None else max(peak, value)

    def _sample(self) -> bool:
        self.peak_anon_mb = self._peak("anon", self.peak_anon_mb, rss_anon_mb())
        self.peak_rss_mb = self._peak("rss", self.peak_rss_mb, rss_mb())
        return True
