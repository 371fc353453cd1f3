"""Explicit feature-row reads: sorted, coalesced into large requests, many in flight (no DGL).

A gather through the shards' memory maps after madvise(MADV_RANDOM) reads one 4 KiB page per page
fault, one fault at a time, while disks give their bandwidth to many large requests at once.
`FeatureReader` is handed the rows a superbatch will need, sorts them, turns each shard's rows into
byte ranges of its `feat` block, merges ranges whose gap is small (reading a gap costs less than
another request), and reads the merged requests with `in_flight` threads into a reused, page-aligned
ring buffer; each task copies its rows out, in the order asked, as soon as it has read them.

With O_DIRECT (the default where the filesystem allows it) the reads bypass the page cache: nothing is
read ahead that was not asked for, and the file pages neither count against a cgroup's memory limit
nor push out the CSC pages the sampler needs. The reader's memory is its ring buffer, `buffer_bytes`.

Measured (scripts/bench_reader.py, bench/results/reader.json: 2M x 128 float32 rows, page cache
dropped, a shared and noisy virtual disk): 500k-1M of the 2M rows at 230-470 MB/s of useful rows
against 40-60 MB/s for the MADV_RANDOM mmap gather (7-8x); 50k rows (2.5 %) at 23-29 MB/s against
17 MB/s (1.5-2x): at that density reading everything in long runs costs about as much as 30k small
requests, and neither beats the disk's streaming rate. in_flight 4-32, gap 64-256 KiB and requests
of 4-16 MiB are within the noise of each other; one thread, requests of 1 MiB or less, and (buffered)
gaps of 4 KiB are clearly slower. The defaults (16, 64 KiB, 4 MiB, 64 MiB of buffer) sit in the flat
part.

Threads, not io_uring: io_uring is not reachable from the Python stdlib. Threads looping over batches
of requests with `os.preadv` (which releases the GIL) are enough for large requests (64 KiB at 16 in
flight: ~90 % of what C threads get here) but cap 4 KiB reads at ~45-50k/s, about 70 % of what C
threads reach on this disk (Python's per-request cost under the GIL); Linux AIO through ctypes
(io_submit with O_DIRECT) would lift that cap if sparse superbatches turn out to matter.

The byte offset of each shard's `feat` data is worked out from the file itself: a shard is a
`torch.save` zip (stored, uncompressed) in which each tensor's storage is one member; the central
directory gives the member's local header, and a restricted unpickler of `data.pkl` (it builds no
object but records storage key, offset, shape and stride) says which member holds `feat` and where.
"""

from __future__ import annotations

import errno
import io
import math
import mmap
import os
import pickle
import struct
import sys
import threading
import time
import zipfile
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from gnnscale.errors import GraphDirError
from gnnscale.storage.graph_dir import GraphDir

# A task is what one thread reads in a loop: about 1/TASKS_PER_THREAD of its share of the ring, at most
# MAX_TASK_REQUESTS requests (a few ms of reads: the ~50 us of handing a task to a thread stays small)
TASKS_PER_THREAD = 4
MAX_TASK_REQUESTS = 256
ALIGN = 4096  # O_DIRECT offset / length / buffer alignment (the logical block size of common devices)
_REBUILD_HINT = "re-run `gnnscale shard` with overwrite=true"


# --------------------------------------------------------------------------- low-level reads
def aligned_buffer(nbytes: int) -> mmap.mmap:
    """Anonymous memory of at least nbytes: mmap memory is page-aligned, as O_DIRECT needs. Private, so
    it counts as the process's anonymous memory (a shared mapping would count as shmem), as planned."""
    return mmap.mmap(-1, max(ALIGN, _align_up(nbytes, ALIGN)), flags=mmap.MAP_PRIVATE)


def open_read(path: str | Path, direct: bool) -> int:
    """A read-only fd; direct=True adds O_DIRECT (OSError EINVAL where the filesystem refuses it)."""
    flags = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)
    if direct:
        if not hasattr(os, "O_DIRECT"):
            raise OSError(errno.EINVAL, "O_DIRECT is not available on this platform")
        flags |= os.O_DIRECT
    return os.open(str(path), flags)


def direct_works(path: str | Path) -> bool:
    """Whether O_DIRECT reads of this file work: some filesystems (tmpfs) refuse the open, others the
    read, both with EINVAL."""
    try:
        fd = open_read(path, direct=True)
    except OSError as exc:
        if exc.errno == errno.EINVAL:
            return False
        raise
    buf = aligned_buffer(ALIGN)
    try:
        read_into(fd, memoryview(buf), 0, direct=True)
        return True
    except OSError as exc:
        if exc.errno == errno.EINVAL:
            return False
        raise
    finally:
        os.close(fd)
        buf.close()


def read_into(fd: int, view: memoryview, offset: int, direct: bool) -> int:
    """Fill `view` from `offset`; returns the bytes read, fewer only at end of file. A short read that
    is not at EOF (a signal) is continued; under O_DIRECT it can only be continued from an aligned
    point, and an unaligned short read is EOF."""
    got, want = 0, len(view)
    while got < want:
        n = os.preadv(fd, [view[got:]], offset + got)
        if n <= 0:
            break
        got += n
        if direct and got % ALIGN:
            break
    return got


def _align_up(x: int, a: int) -> int:
    return -(-x // a) * a


# --------------------------------------------------------------------------- shard layout
STORAGE_DTYPES = {
    "FloatStorage": "float32",
    "DoubleStorage": "float64",
    "HalfStorage": "float16",
    "BFloat16Storage": "bfloat16",
    "LongStorage": "int64",
    "IntStorage": "int32",
    "ShortStorage": "int16",
    "CharStorage": "int8",
    "ByteStorage": "uint8",
    "BoolStorage": "bool",
}


@dataclass(frozen=True)
class _Storage:
    key: str
    dtype: str | None
    numel: int


@dataclass(frozen=True)
class _TensorRecord:
    storage: _Storage
    offset: int  # in elements
    size: tuple
    stride: tuple


@dataclass(frozen=True)
class _StorageType:
    dtype: str | None


def _rebuild_tensor_v2(storage, storage_offset, size, stride, *_rest):
    return _TensorRecord(storage, int(storage_offset), tuple(size), tuple(stride))


def _ordered_dict(*args):
    return dict(*args)


class _LayoutUnpickler(pickle.Unpickler):
    """Reads a torch.save data.pkl into _TensorRecords: only the few globals a dict of plain tensors
    names are allowed, and none of them builds a real object (so a shard cannot run code here either)."""

    def find_class(self, module: str, name: str):
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return _rebuild_tensor_v2
        if (module, name) == ("collections", "OrderedDict"):
            return _ordered_dict
        if module == "torch" and name.endswith("Storage"):
            return _StorageType(STORAGE_DTYPES.get(name))
        raise pickle.UnpicklingError(f"unexpected global {module}.{name}")

    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise pickle.UnpicklingError(f"unexpected persistent id {pid!r}")
        _, kind, key, _location, numel = pid
        dtype = kind.dtype if isinstance(kind, _StorageType) else None
        return _Storage(str(key), dtype, int(numel))


@dataclass(frozen=True)
class FeatExtent:
    """Where one shard's `feat` rows lie: bytes [offset, offset + rows * row_bytes) of `path`."""

    path: Path
    offset: int
    rows: int
    file_size: int


def _layout_error(path: Path, why: str) -> GraphDirError:
    return GraphDirError(f"cannot locate the features in shard {path}: {why}", _REBUILD_HINT)


def feat_extent(path: str | Path, rows: int, feat_dim: int, dtype: str) -> FeatExtent:
    """The byte extent of `feat` in a torch.save shard, checked against what meta.json says."""
    path = Path(path)
    try:
        with zipfile.ZipFile(path) as zf:
            pkl = [i for i in zf.infolist() if i.filename.endswith("data.pkl")]
            if len(pkl) != 1:
                raise _layout_error(path, "not one data.pkl in the archive")
            prefix = pkl[0].filename[: -len("data.pkl")]
            names = set(zf.namelist())
            if f"{prefix}byteorder" in names and zf.read(f"{prefix}byteorder").strip() != b"little":
                raise _layout_error(path, "the tensors are stored big-endian")
            record = _LayoutUnpickler(io.BytesIO(zf.read(pkl[0]))).load()
            if not isinstance(record, dict) or not isinstance(record.get("feat"), _TensorRecord):
                raise _layout_error(path, "no `feat` tensor in data.pkl")
            feat = record["feat"]
            member = zf.getinfo(f"{prefix}data/{feat.storage.key}")
    except (zipfile.BadZipFile, pickle.UnpicklingError, KeyError, EOFError, ValueError, TypeError) as exc:
        raise _layout_error(path, str(exc) or type(exc).__name__) from None
    _check_feat(path, feat, member, rows, feat_dim, dtype)
    with open(path, "rb") as fh:
        fh.seek(member.header_offset)
        head = fh.read(30)
    if len(head) != 30 or head[:4] != b"PK\x03\x04":
        raise _layout_error(path, "bad zip local header")
    name_len, extra_len = struct.unpack("<HH", head[26:30])
    itemsize = torch.empty((), dtype=getattr(torch, dtype)).element_size()
    offset = member.header_offset + 30 + name_len + extra_len + feat.offset * itemsize
    size = path.stat().st_size
    if offset + rows * feat_dim * itemsize > size:
        raise _layout_error(path, "the file is shorter than its feature rows")
    return FeatExtent(path, offset, rows, size)


def _check_feat(path: Path, feat: _TensorRecord, member, rows: int, feat_dim: int, dtype: str) -> None:
    """The layout the reader assumes: meta's dtype and shape, row-major contiguous, stored uncompressed."""
    if sys.byteorder != "little":
        raise _layout_error(path, "the reader assumes a little-endian machine")
    if member.compress_type != zipfile.ZIP_STORED:
        raise _layout_error(path, "the feature member is compressed")
    if feat.storage.dtype != dtype:
        raise _layout_error(path, f"feat is {feat.storage.dtype}, meta.json says {dtype}")
    if feat.size != (rows, feat_dim):
        raise _layout_error(path, f"feat has shape {feat.size}, meta.json says ({rows}, {feat_dim})")
    if rows > 1 and feat_dim > 0 and feat.stride != (feat_dim, 1):
        raise _layout_error(path, f"feat is not row-major contiguous (stride {feat.stride})")
    itemsize = torch.empty((), dtype=getattr(torch, dtype)).element_size()
    if (
        feat.offset + rows * feat_dim > feat.storage.numel
        or member.file_size != feat.storage.numel * itemsize
    ):
        raise _layout_error(path, "the feature storage is smaller than its rows")


# --------------------------------------------------------------------------- planning
@dataclass
class _Requests:
    """Merged reads for sorted unique rows: request j reads [start[j], start[j] + length[j]) of shard
    shard[j] (length aligned for O_DIRECT), and must return at least `needed[j]` bytes; row i of the
    sorted set lies in request req[i] at byte `within[i]` of it."""

    shard: np.ndarray
    start: np.ndarray
    length: np.ndarray
    needed: np.ndarray
    covered: np.ndarray  # bytes up to end of file: what the read returns
    req: np.ndarray
    within: np.ndarray


def plan_requests(
    shard: np.ndarray,
    row_start: np.ndarray,
    row_bytes: int,
    *,
    align: int,
    gap: int,
    stride: int,
    eof: np.ndarray,
) -> _Requests:
    """Coalesce byte ranges [row_start, row_start + row_bytes) (sorted by shard, then offset) into
    requests: a new request starts at a shard change, a gap larger than `gap`, or where the request
    would pass `stride` bytes from the start of its run (stride leaves room for one row and its
    alignment within max_request_bytes). Vectorised: no Python loop per row."""
    a = row_start // align * align
    b = -(-(row_start + row_bytes) // align) * align
    brk = np.ones(len(a), dtype=bool)
    if len(a) > 1:
        brk[1:] = (shard[1:] != shard[:-1]) | (a[1:] - b[:-1] > gap)
    run_first = np.flatnonzero(brk)
    run_start = a[run_first][np.cumsum(brk) - 1]
    piece = (a - run_start) // stride
    new = brk.copy()
    if len(a) > 1:
        new[1:] |= piece[1:] != piece[:-1]
    first = np.flatnonzero(new)
    last = np.append(first[1:] - 1, len(a) - 1)
    req = np.cumsum(new) - 1
    start = a[first]
    end = b[last]
    req_shard = shard[first]
    return _Requests(
        shard=req_shard,
        start=start,
        length=end - start,
        needed=row_start[last] + row_bytes - start,
        covered=np.minimum(end, eof[req_shard]) - start,
        req=req,
        within=row_start - start[req],
    )


def split_tasks(length: np.ndarray, task_bytes: int, task_requests: int) -> list[tuple[int, int]]:
    """Consecutive request ranges [lo, hi) of at most task_bytes (or one larger request) and at most
    task_requests each: a task is what one thread reads in a loop before it takes the next, so small
    requests are batched (a future per 4 KiB read would cost more than the read) while a small read
    still spreads over the threads."""
    cum = np.cumsum(length)
    tasks, lo, n = [], 0, len(length)
    while lo < n:
        base = int(cum[lo - 1]) if lo else 0
        hi = int(np.searchsorted(cum, base + task_bytes, side="right"))
        hi = min(max(hi, lo + 1), lo + task_requests)
        tasks.append((lo, hi))
        lo = hi
    return tasks


def settle(futures) -> None:
    """Wait for every future, ignoring what they raise (the first error is already on its way)."""
    for fut in futures:
        try:
            fut.result()
        except BaseException:
            pass


class _Ring:
    """First-in first-out allocation of a byte buffer: tasks are consumed in the order they were
    placed, so a head and the oldest live block are all it takes."""

    def __init__(self, size: int):
        self.size = size
        self.live: deque[tuple[int, int]] = deque()

    def alloc(self, n: int) -> int | None:
        if not self.live:
            at = 0
        else:
            head, tail = self.live[-1][1], self.live[0][0]
            if self.live[-1][0] >= tail:  # not wrapped: free space after the newest and before the oldest
                at = head if head + n <= self.size else (0 if n <= tail else None)
            else:  # wrapped: the free space lies between the newest and the oldest
                at = head if head + n <= tail else None
        if at is None or at + n > self.size:
            return None
        self.live.append((at, at + n))
        return at

    def free_oldest(self) -> None:
        self.live.popleft()


class SpanRead:
    """A span being read (FeatureReader.read_span): result() waits for it and gives its rows, a
    [rows, feat_dim] view of the buffer (valid until the buffer is read into again)."""

    def __init__(self, reader, jobs: list, buf: mmap.mmap, shift: int, rows: int, nbytes: int):
        self.reader, self.jobs, self.buf = reader, jobs, buf
        self.shift, self.rows, self.nbytes = shift, rows, nbytes
        self.t0 = time.perf_counter()

    def result(self) -> torch.Tensor:
        try:
            for job in self.jobs:
                job.result()
        except BaseException:
            settle(self.jobs)  # nothing may still write into the buffer once this returns
            raise
        r = self.reader
        r.stats["requests"] += len(self.jobs)
        r.stats["bytes_read"] += self.nbytes
        r.stats["seconds"] += time.perf_counter() - self.t0
        raw = torch.frombuffer(self.buf, dtype=torch.uint8, count=self.rows * r.row_bytes, offset=self.shift)
        # bytes, not dtype: the rows need not be aligned to their element size within the page
        return raw.view(self.rows, r.row_bytes)


# --------------------------------------------------------------------------- the reader
class FeatureReader:
    """Rows of the stored feature columns for any node IDs, read explicitly (see the module doc).

    Not for concurrent use by several threads at once: calls are serialised by a lock (one ring buffer).
    """

    def __init__(
        self,
        graph: GraphDir | str | Path,
        in_flight: int = 16,
        direct: bool | None = None,
        gap_bytes: int = 64 << 10,
        max_request_bytes: int = 4 << 20,
        buffer_bytes: int = 64 << 20,
    ):
        self.graph = graph if isinstance(graph, GraphDir) else GraphDir(graph)
        meta = self.graph.meta
        self.num_nodes = self.graph.num_nodes
        self.feat_dim = int(meta["feat_dim"])
        self.dtype = getattr(torch, str(meta["feat_dtype"]))
        self.row_bytes = self.feat_dim * torch.empty((), dtype=self.dtype).element_size()
        self.in_flight = max(1, int(in_flight))
        self.gap_bytes = max(0, int(gap_bytes))
        self._starts = np.asarray(self.graph.node_starts, dtype=np.int64)
        self.extents = [
            feat_extent(
                self.graph.path / s["file"],
                s["node_end"] - s["node_start"],
                self.feat_dim,
                meta["feat_dtype"],
            )
            for s in meta["shards"]
        ]
        self.direct = self._choose_direct(direct)
        self._align = ALIGN if self.direct else 1
        self._size_buffers(int(max_request_bytes), int(buffer_bytes))
        self._fds: list[int] = []
        self._ring_mem: mmap.mmap | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self.stats = {"requests": 0, "bytes_read": 0, "rows": 0, "seconds": 0.0}
        try:
            self._fds = [self._open(e.path) for e in self.extents]
            if not self.direct:
                self._advise_random()
        except BaseException:
            self.close()
            raise

    # -- set-up
    def _choose_direct(self, direct: bool | None) -> bool:
        if direct is False or not self.extents:
            return False
        works = direct_works(self.extents[0].path)
        if direct and not works:
            raise GraphDirError(
                f"the filesystem of {self.graph.path} refuses O_DIRECT reads",
                "use FeatureReader(direct=None) to fall back to buffered reads",
            )
        return works

    def _size_buffers(self, max_request_bytes: int, buffer_bytes: int) -> None:
        """The largest request must leave room in the ring for several in flight; every request must
        hold one row with its alignment. A buffer too small for that is grown (buffer_bytes says so)."""
        a = self._align
        min_request = _align_up(self.row_bytes + 3 * a, a)
        self.buffer_bytes = max(_align_up(buffer_bytes, ALIGN), _align_up(4 * min_request, ALIGN))
        cap = min(max_request_bytes, self.buffer_bytes // 4) // a * a
        self.max_request_bytes = max(cap, min_request)
        # rows whose aligned start lies within `stride` of their run's start fit max_request_bytes
        self._stride = self.max_request_bytes - self.row_bytes - 2 * a
        # small tasks: the ring holds several per thread, so a slow one does not leave threads idle
        self._task_bytes = max(ALIGN, self.buffer_bytes // (TASKS_PER_THREAD * self.in_flight))

    def _open(self, path: Path) -> int:
        try:
            return open_read(path, self.direct)
        except FileNotFoundError:
            raise GraphDirError(f"shard {path} is missing", _REBUILD_HINT) from None

    def _advise_random(self) -> None:
        """Buffered reads ask for exactly the bytes needed: kernel read-ahead around them would only
        fill the page cache with rows nobody asked for."""
        if hasattr(os, "posix_fadvise"):
            for fd in self._fds:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)

    def _ensure_started(self) -> None:
        if self._ring_mem is None:
            self._ring_mem = aligned_buffer(self.buffer_bytes)
            self._ring_view = memoryview(self._ring_mem)
            ring = torch.frombuffer(self._ring_mem, dtype=torch.uint8)
            # one "row" starting at every byte of the ring: index_select then copies each wanted row
            # wherever a request placed it (rows are not aligned to row_bytes inside a request)
            self._rows_at = torch.as_strided(ring, (len(ring) - self.row_bytes + 1, self.row_bytes), (1, 1))
        self._ensure_pool()

    def _ensure_pool(self) -> None:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.in_flight, thread_name_prefix="feature-reader")

    # -- planning
    def _plan(self, ids: np.ndarray) -> _Requests:
        """Requests for sorted unique global ids."""
        shard = np.searchsorted(self._starts, ids, side="right") - 1
        offsets = np.array([e.offset for e in self.extents], dtype=np.int64)
        eof = np.array([e.file_size for e in self.extents], dtype=np.int64)
        row_start = offsets[shard] + (ids - self._starts[shard]) * self.row_bytes
        return plan_requests(
            shard,
            row_start,
            self.row_bytes,
            align=self._align,
            gap=self.gap_bytes,
            stride=self._stride,
            eof=eof,
        )

    def plan(self, ids_sorted_unique: torch.Tensor) -> dict:
        """What reading these rows would cost, without reading: {"requests", "bytes", "rows",
        "useful_bytes"} (bytes: what the reads cover, alignment and merged gaps included)."""
        ids = self._unique(ids_sorted_unique)[0]
        reqs = self._plan(ids.numpy())
        return {
            "requests": len(reqs.start),
            "bytes": int(reqs.covered.sum()),
            "rows": len(ids),
            "useful_bytes": len(ids) * self.row_bytes,
        }

    def _unique(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(sorted unique ids, inverse) — inverse None when ids were sorted and unique already (the
        superbatch case), so rows can be copied straight into place."""
        ids = torch.as_tensor(ids, dtype=torch.int64).reshape(-1)
        if len(ids) and (int(ids.min()) < 0 or int(ids.max()) >= self.num_nodes):
            raise IndexError(f"node id out of range [0, {self.num_nodes})")
        if len(ids) < 2 or bool((ids[1:] > ids[:-1]).all()):
            return ids.contiguous(), None
        return torch.unique(ids, sorted=True, return_inverse=True)

    # -- reading
    def read_rows(self, ids: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """[len(ids), feat_dim] rows in the order of ids (any order, duplicates allowed, any shards);
        out= a preallocated contiguous tensor of that shape and dtype to fill."""
        t0 = time.perf_counter()
        uniq, inverse = self._unique(ids)
        n = len(ids) if inverse is None else len(inverse)
        out = self._check_out(out, n)
        if n == 0:
            return out
        with self._lock:
            self._ensure_started()
            reqs = self._plan(uniq.numpy())
            self._read(reqs, uniq, inverse, out.view(torch.uint8))
            self.stats["requests"] += len(reqs.start)
            self.stats["bytes_read"] += int(reqs.covered.sum())
            self.stats["rows"] += len(uniq)
            self.stats["seconds"] += time.perf_counter() - t0
        return out

    def _check_out(self, out: torch.Tensor | None, n: int) -> torch.Tensor:
        if out is None:
            return torch.empty((n, self.feat_dim), dtype=self.dtype)
        if out.shape != (n, self.feat_dim) or out.dtype != self.dtype or not out.is_contiguous():
            raise ValueError(
                f"out must be a contiguous {self.dtype} tensor of shape ({n}, {self.feat_dim}), "
                f"got {out.dtype} {tuple(out.shape)}"
            )
        return out

    def _read(self, reqs: _Requests, uniq: torch.Tensor, inverse, out_bytes: torch.Tensor) -> None:
        """Keep tasks in flight while the ring has room, and give a task's space back once it is done.
        Each task copies its own rows out after reading them: on this thread every copy would first
        wait for the GIL behind the reading threads, and the ring would drain slower than it fills."""
        n_req = len(reqs.start)
        per_task = min(MAX_TASK_REQUESTS, math.ceil(n_req / (TASKS_PER_THREAD * self.in_flight)))
        tasks = split_tasks(reqs.length, self._task_bytes, max(1, per_task))
        # rows of a task are a contiguous range of the sorted unique ids: request -> its first row
        first_row = np.searchsorted(reqs.req, np.arange(n_req + 1)).tolist()
        req_at = np.cumsum(reqs.length) - reqs.length  # where a request lies if its task sat at 0...
        order = sorted_inverse = None
        if inverse is not None:
            sorted_inverse, order = torch.sort(inverse, stable=True)
            bounds = torch.searchsorted(sorted_inverse, torch.tensor(first_row)).tolist()
        ring, pending, nxt = _Ring(self.buffer_bytes), deque(), 0
        lists = (reqs.shard.tolist(), reqs.start.tolist(), reqs.length.tolist(), reqs.needed.tolist())
        while pending or nxt < len(tasks):
            while nxt < len(tasks):
                lo, hi = tasks[nxt]
                at = ring.alloc(int(req_at[hi - 1] + reqs.length[hi - 1] - req_at[lo]))
                if at is None:
                    if not pending:  # cannot happen: a task is at most a quarter of the ring
                        raise RuntimeError("a read task does not fit the feature reader's buffer")
                    break
                shift = at - int(req_at[lo])  # ...and here it lies
                r0, r1 = first_row[lo], first_row[hi]
                pos = torch.from_numpy(req_at[reqs.req[r0:r1]] + reqs.within[r0:r1] + shift)
                if order is None:  # ids were sorted and unique: row i of the set is row i of out
                    copy = (pos, None, out_bytes[r0:r1])
                else:  # out rows that want rows r0..r1 of the set, and where each finds its row
                    a, b = bounds[lo], bounds[hi]
                    copy = (pos[sorted_inverse[a:b] - r0], order[a:b], out_bytes)
                job = [x[lo:hi] for x in lists] + [(req_at[lo:hi] + shift).tolist(), copy]
                pending.append(self._pool.submit(self._read_task, *job))
                nxt += 1
            try:
                pending.popleft().result()
            except BaseException:
                settle(pending)  # no task may still write into the ring or `out` once this returns
                raise
            ring.free_oldest()

    def _read_task(self, shards, starts, lengths, needed, offs, copy) -> None:
        """One thread's batch of requests, read one after another (the other threads keep the rest of
        in_flight busy), then its rows copied out. The loop is kept lean on purpose: at 4 KiB requests
        Python's per-request cost, not the disk, sets the rate (bench/results/reader.json)."""
        view, fds, preadv = self._ring_view, self._fds, os.preadv
        for s, off, ln, need, at in zip(shards, starts, lengths, needed, offs, strict=True):
            got = preadv(fds[s], [view[at : at + ln]], off)
            if got < need:  # a signal, or the end of the file: finish it the careful way
                self._finish_short(s, view[at : at + ln], off, got, need)
        src, dst_rows, dst = copy
        if dst_rows is None:
            torch.index_select(self._rows_at, 0, src, out=dst)
        else:
            dst.index_copy_(0, dst_rows, torch.index_select(self._rows_at, 0, src))

    # -- dense spans (a sweep's chunks)
    def spans(self, max_rows: int) -> np.ndarray:
        """Node ids where spans of at most max_rows rows start, cut at shard boundaries (a span lies in one
        shard's `feat` block, so it is one byte range), ending with num_nodes."""
        cuts = [
            np.linspace(lo, hi, -(-(hi - lo) // max(1, max_rows)) + 1).round().astype(np.int64)[:-1]
            for lo, hi in zip(self._starts[:-1].tolist(), self._starts[1:].tolist(), strict=True)
            if hi > lo
        ]
        return np.concatenate([*cuts, [self.num_nodes]]).astype(np.int64)

    def span_buffer(self, max_rows: int) -> mmap.mmap:
        """A buffer read_span can read up to max_rows rows into (their byte range, aligned at both ends)."""
        return aligned_buffer(max_rows * self.row_bytes + 2 * ALIGN)

    def read_span(self, lo: int, hi: int, buf: mmap.mmap) -> SpanRead:
        """Start reading rows [lo, hi) of one shard (a span of spans()) into buf: whole, in requests of
        max_request_bytes, all in flight at once on the reader's threads. For rows that are most of their
        range this beats the coalesced sparse read: no planning, no copy out of the ring (the rows are
        read where they are used), and the disk sees only long requests."""
        lo, hi = int(lo), int(hi)
        s = int(np.searchsorted(self._starts, lo, side="right") - 1)
        if not (0 <= lo < hi <= self._starts[s + 1]):
            raise IndexError(f"rows [{lo}, {hi}) are not within one shard")
        e = self.extents[s]
        first = e.offset + (lo - int(self._starts[s])) * self.row_bytes
        end = first + (hi - lo) * self.row_bytes
        a, b = first // self._align * self._align, _align_up(end, self._align)
        if b - a > len(buf):
            raise ValueError(f"a span of {b - a} bytes does not fit a buffer of {len(buf)}")
        self._ensure_pool()
        view, step = memoryview(buf), self.max_request_bytes
        jobs = [
            self._pool.submit(
                self._read_request, s, view[o - a : min(o + step, b) - a], o, min(o + step, end) - o
            )
            for o in range(a, b, step)
        ]
        return SpanRead(self, jobs, buf, first - a, hi - lo, b - a)

    def _read_request(self, s: int, view: memoryview, off: int, need: int) -> None:
        got = os.preadv(self._fds[s], [view], off)
        if got < need:
            self._finish_short(s, view, off, got, need)

    def _finish_short(self, s: int, view: memoryview, off: int, got: int, need: int) -> None:
        if got > 0 and not (self.direct and got % ALIGN):
            got += read_into(self._fds[s], view[got:], off + got, self.direct)
        if got < need:
            raise GraphDirError(
                f"shard {self.extents[s].path} ended early ({got} of {need} bytes at offset {off})",
                _REBUILD_HINT,
            )

    # -- teardown
    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        for fd in self._fds:
            os.close(fd)
        self._fds = []
        if self._ring_mem is not None:
            self._rows_at = self._ring_view = None
            try:
                self._ring_mem.close()
            except BufferError:  # a tensor still views it: the memory goes when that does
                pass
            self._ring_mem = None

    def __enter__(self) -> FeatureReader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


__all__ = [
    "FeatureReader",
    "SpanRead",
    "FeatExtent",
    "feat_extent",
    "aligned_buffer",
    "open_read",
    "read_into",
    "ALIGN",
]
