"""Memory meters. RssAnon is heap the kernel cannot reclaim; mmap'd page cache is not counted there."""

from __future__ import annotations

import resource
import threading
import time


def _status_kb(field: str) -> int:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def rss_anon_mb() -> float:
    return _status_kb("RssAnon") / 1024.0


def rss_mb() -> float:
    return _status_kb("VmRSS") / 1024.0


def peak_rss_mb() -> float:
    """Peak resident set of this process since it started (ru_maxrss, KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


class MemorySampler:
    """Samples RssAnon and VmRSS in a background thread; the peaks are what a stage must stay under."""

    def __init__(self, interval_s: float = 0.05):
        self.interval_s = interval_s
        self.peak_anon_mb = 0.0
        self.peak_rss_mb = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _sample(self) -> None:
        self.peak_anon_mb = max(self.peak_anon_mb, rss_anon_mb())
        self.peak_rss_mb = max(self.peak_rss_mb, rss_mb())

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._sample()
            time.sleep(self.interval_s)

    def __enter__(self) -> "MemorySampler":
        self._sample()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._sample()
