"""What the disk under a graph_dir gives: measured once with reads of the graph's own shard files.

The training side sets the reads it plans against what the disk can deliver (a sweep's chunks read in
long sequential runs or in many small random ones, with how many in flight), and the time split says
how far the wait is from the disk's rate. Five numbers, each from `seconds` of reads:

- sequential MB/s with 16 MiB requests, one at a time, and with 4 MiB requests, 16 in flight (what the
  reader's coalesced dense reads do);
- random 4 KiB reads per second with 1 and with 16 in flight (a page fault is the first; the reader's
  sparse sets the second);
- random 64 KiB MB/s with 16 in flight (coalesced sparse reads).

Reads go through the same Python pread loop as `FeatureReader` (threads, page-aligned buffers,
O_DIRECT), so the numbers are what the reader can get; on fast devices that is below what the device
itself could do with the per-request cost of C. O_DIRECT keeps every read off the page cache; where
the filesystem refuses it, the files' cached pages are dropped first (posix_fadvise DONTNEED) and the
result says `"direct": false`. The graph_dir is only read, except for the result kept in
`graph_dir/disk_probe.json` with what identifies the device (st_dev, bytes probed) and reused until the
device or the files change or `refresh=True`; a read-only graph_dir keeps it in this process's memory.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import numpy as np

from gnnscale.errors import GnnscaleError, GraphDirError
from gnnscale.storage.feature_reader import aligned_buffer, direct_works, open_read, read_into
from gnnscale.storage.meta import read_meta
from gnnscale.utils.atomic import write_json

PROBE_FILE = "disk_probe.json"
PROBE_VERSION = 2
SEQ_REQUEST = 16 << 20
SWEEP_REQUEST = 4 << 20  # the reader's largest coalesced request (FeatureReader's max_request_bytes)
SMALL_BYTES = 64 << 20  # below this the random reads revisit the same blocks: noisy, marked "small"
CHECK_EVERY = 64  # requests between clock reads in the timed loops
PLAN_CHUNK = 4096  # random offsets drawn at once by numpy: the timed loop only reads
_in_memory: dict[str, dict] = {}  # results for graph_dirs that cannot hold disk_probe.json


def probe_disk(graph_dir: str | Path, seconds: float = 1.5, refresh: bool = False) -> dict:
    """The disk's rates for this graph_dir (see the module doc): measured, or the kept result when it
    was measured on the same device and files. `cached` says which; `saved` where it is kept."""
    graph_dir = Path(graph_dir)
    files = shard_files(graph_dir)
    ident = identity(files)
    if not refresh:
        kept = _kept(graph_dir, ident)
        if kept is not None:
            return {**kept, "cached": True}
    result = {"version": PROBE_VERSION, **ident, **measure(files, seconds), "time": round(time.time(), 3)}
    result["saved"] = _keep(graph_dir, result)
    return {**result, "cached": False}


def shard_files(graph_dir: Path) -> list[Path]:
    meta = read_meta(graph_dir)
    files = [graph_dir / s["file"] for s in meta["shards"]]
    missing = [f for f in files if not f.is_file()]
    if missing:
        raise GraphDirError(f"shard {missing[0]} is missing", "re-run `gnnscale shard` with overwrite=true")
    return files


def identity(files: list[Path]) -> dict:
    """What ties a measurement to a disk: the device of the files and how much was there to read."""
    stats = [f.stat() for f in files]
    return {
        "st_dev": int(stats[0].st_dev),
        "bytes_probed": int(sum(s.st_size for s in stats)),
        "files": len(files),
    }


def _kept(graph_dir: Path, ident: dict) -> dict | None:
    candidates = []
    try:
        candidates.append(json.loads((graph_dir / PROBE_FILE).read_text()))
    except (OSError, ValueError):
        pass
    candidates.append(_in_memory.get(str(graph_dir.resolve())))
    for kept in candidates:
        if (
            isinstance(kept, dict)
            and kept.get("version") == PROBE_VERSION
            and all(kept.get(k) == v for k, v in ident.items())
        ):
            return kept
    return None


def _keep(graph_dir: Path, result: dict) -> str:
    """Into graph_dir/disk_probe.json, or (a read-only graph_dir) this process's memory: a probe that
    cannot be saved is measured again by the next process, nothing else changes."""
    try:
        write_json(graph_dir / PROBE_FILE, {**result, "saved": "file"})
        return "file"
    except (OSError, GnnscaleError):
        _in_memory[str(graph_dir.resolve())] = {**result, "saved": "memory"}
        return "memory"


# --------------------------------------------------------------------------- measuring
def measure(files: list[Path], seconds: float) -> dict:
    direct = direct_works(files[0])
    fds = [open_read(f, direct) for f in files]
    sizes = np.array([os.fstat(fd).st_size for fd in fds], dtype=np.int64)
    try:
        if not direct:
            _drop_cached(fds)
        seq = _sequential(fds, sizes, seconds, direct)
        sweep = _sweep(fds, sizes, seconds, direct)
        r4_1 = _random(fds, sizes, 4096, 1, seconds, direct)
        r4_16 = _random(fds, sizes, 4096, 16, seconds, direct)
        r64_16 = _random(fds, sizes, 64 << 10, 16, seconds, direct)
    finally:
        for fd in fds:
            os.close(fd)
    result = {
        "direct": direct,
        "seq_mb_s": round(seq / 1e6, 1),
        "sweep_mb_s_qd16": round(sweep / 1e6, 1),
        "rand4k_iops_qd1": round(r4_1[0]),
        "rand4k_iops_qd16": round(r4_16[0]),
        "rand4k_mb_s_qd16": round(r4_16[1] / 1e6, 1),
        "rand64k_mb_s_qd16": round(r64_16[1] / 1e6, 1),
        # reading a gap this long costs as much as one more 4 KiB request (at the better of the two
        # streaming rates: some disks need several requests in flight to stream): merge reads closer
        "break_even_gap_bytes": int(max(seq, r64_16[1]) / r4_16[0]) if r4_16[0] > 0 else None,
        "seconds_per_test": seconds,
        "small": bool(sizes.sum() < SMALL_BYTES),
    }
    if not direct:
        result["note"] = "O_DIRECT refused: buffered reads after dropping the files' cached pages"
    return result


def _drop_cached(fds: list[int]) -> None:
    """Without O_DIRECT a read may come from the page cache: start each test with none of it cached,
    and keep the kernel from reading around the random reads."""
    for fd in fds:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)


def _sequential(fds: list[int], sizes: np.ndarray, seconds: float, direct: bool) -> float:
    """Bytes/s of 16 MiB reads front to back through the files, one at a time. Under O_DIRECT a small
    graph is read again from the start until the time is up; buffered, one pass (a second would be
    cached)."""
    buf = aligned_buffer(SEQ_REQUEST)
    view, done = memoryview(buf), 0
    t0 = time.perf_counter()
    try:
        while True:
            for fd, size in zip(fds, sizes.tolist(), strict=True):
                for off in range(0, size, SEQ_REQUEST):
                    done += read_into(fd, view, off, direct)
                    if time.perf_counter() - t0 >= seconds:
                        return done / (time.perf_counter() - t0)
            if not direct:
                return done / (time.perf_counter() - t0)
    finally:
        view.release()
        buf.close()


def _sweep(fds: list[int], sizes: np.ndarray, seconds: float, direct: bool, in_flight: int = 16) -> float:
    """Bytes/s of what the reader does with a dense superbatch: SWEEP_REQUEST reads front to back through
    the files, `in_flight` threads each taking the next request (a disk that streams better with several
    requests queued shows it here, not in the one-at-a-time sequential number)."""
    if not direct:
        _drop_cached(fds)
    chunks = [(i, off) for i, size in enumerate(sizes.tolist()) for off in range(0, size, SWEEP_REQUEST)]
    if not chunks:
        return 0.0
    cursor, lock = [0], threading.Lock()
    got = [0] * in_flight
    deadline = time.perf_counter() + seconds

    def worker(k: int) -> None:
        buf = aligned_buffer(SWEEP_REQUEST)
        view = memoryview(buf)
        try:
            while time.perf_counter() < deadline:
                with lock:
                    j = cursor[0]
                    cursor[0] += 1
                if j >= len(chunks) and not direct:  # buffered: a second pass would be cached
                    return
                f, off = chunks[j % len(chunks)]
                got[k] += read_into(fds[f], view, off, direct)
        finally:
            view.release()
            buf.close()

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker, args=(k,)) for k in range(in_flight)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(got) / (time.perf_counter() - t0)


def _random(
    fds: list[int], sizes: np.ndarray, req: int, in_flight: int, seconds: float, direct: bool
) -> tuple[float, float]:
    """(requests/s, bytes/s) of aligned random `req`-byte reads, `in_flight` threads each looping over
    its own precomputed offsets (the reader's pattern) for `seconds`. A file's last block may be short,
    and a file smaller than `req` is read whole: a small graph is probed with what it has."""
    if not direct:
        _drop_cached(fds)
    blocks = -(-sizes // req)
    if blocks.sum() == 0:
        return 0.0, 0.0
    done = [(0, 0)] * in_flight  # (requests, bytes) per thread
    weights = blocks / blocks.sum()
    deadline = time.perf_counter() + seconds

    def worker(k: int) -> None:
        rng, n, got = np.random.default_rng([req, k]), 0, 0
        buf = aligned_buffer(req)
        view = memoryview(buf)
        try:
            while time.perf_counter() < deadline:
                which = rng.choice(len(fds), PLAN_CHUNK, p=weights)
                offs = (rng.integers(0, blocks[which]) * req).tolist()
                for i, (f, off) in enumerate(zip(which.tolist(), offs, strict=True)):
                    got += os.preadv(fds[f], [view], off)
                    if i % CHECK_EVERY == 0 and time.perf_counter() >= deadline:
                        n += i + 1
                        return
                n += PLAN_CHUNK
        finally:
            done[k] = (n, got)
            view.release()
            buf.close()

    threads = [threading.Thread(target=worker, args=(k,), daemon=True) for k in range(in_flight)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    return sum(d[0] for d in done) / elapsed, sum(d[1] for d in done) / elapsed


__all__ = ["probe_disk", "PROBE_FILE"]
