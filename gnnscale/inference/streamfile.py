"""Layer files written or read once, front to back, by a background thread with O_DIRECT (no page cache).

A run writes some layer files it never reads again (conv outputs; an update's hidden layers that the next
layer does not read in place) and an update reads the base run's files once, in order. Going through the
page cache costs a fresh page per 4 KiB for nothing: on the benchmark machine (a VM that returns freed
memory to its host) filling 1 GB of new page cache took 2.5-4.5 s of CPU, against 1.3 s of wall and
~0 CPU for the same bytes with O_DIRECT, which a background thread overlaps with the compute.
Filesystems without O_DIRECT (tmpfs) get the same code with ordinary reads and writes.

Data starts at a 4 KiB-aligned offset (layerfile.create_layer_file pads the .npy header), so every chunk
but the file's tail is aligned for O_DIRECT; the tail goes through an ordinary descriptor.
"""

from __future__ import annotations

import mmap
import os
import queue
import threading
from pathlib import Path

import numpy as np
import torch

from gnnscale.inference.layerfile import ALIGN, _header_len, create_layer_file

_CHUNK = 8 << 20  # bytes per O_DIRECT request
_DEPTH = 2  # requests queued ahead of the thread
# Smaller files go through the page cache: there a fresh page costs little in total, and O_DIRECT's
# per-request latency would dominate (on a 20k-node graph it tripled an update's layer times).
DIRECT_MIN_BYTES = 64 << 20


def _open_direct(path: Path, flags: int) -> tuple[int, bool]:
    direct = getattr(os, "O_DIRECT", 0) if os.path.getsize(path) >= DIRECT_MIN_BYTES else 0
    if direct:
        try:
            return os.open(path, flags | direct), True
        except OSError:
            pass  # tmpfs and a few others refuse O_DIRECT
    return os.open(path, flags), False


class _Worker:
    """One thread running queued calls in order; an exception is raised again in the caller's thread."""

    def __init__(self):
        self._q: queue.Queue = queue.Queue(maxsize=_DEPTH)
        self.error: BaseException | None = None
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self) -> None:
        while True:
            job = self._q.get()
            if job is None:
                return
            if self.error is None:
                try:
                    job()
                except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
                    self.error = exc

    def submit(self, job) -> None:
        self.check()
        self._q.put(job)

    def check(self) -> None:
        if self.error is not None:
            raise self.error

    def join(self) -> None:
        self._q.put(None)
        self._t.join()
        self.check()


class StreamWriter:
    """A new [rows, dim] layer file, written with ascending contiguous write_range calls only."""

    def __init__(self, path: str | Path, shape: tuple[int, int], dtype=np.float32):
        self.path, self.shape, self.mode = Path(path), tuple(shape), "stream"
        self.offset = create_layer_file(self.path, self.shape, dtype)
        self.row_bytes = int(np.prod(self.shape[1:])) * np.dtype(dtype).itemsize
        self.dtype = np.dtype(dtype)
        self._end = self.offset + self.shape[0] * self.row_bytes
        self._fd, self.direct = _open_direct(self.path, os.O_WRONLY)
        self._free: queue.Queue = queue.Queue()
        for _ in range(_DEPTH + 2):  # queued + being written + being filled, and one spare
            self._free.put(mmap.mmap(-1, _CHUNK))  # page-aligned, as O_DIRECT wants
        self._buf = self._free.get()
        self._fill = 0
        self._at = self.offset  # file offset of self._buf[0]
        self._worker = _Worker()

    def write(self, ids: np.ndarray, rows: torch.Tensor) -> None:
        if len(ids) and int(ids[-1]) - int(ids[0]) + 1 != len(ids):
            raise ValueError(f"{self.path.name}: a stream file takes contiguous rows only")
        if len(ids):
            self.write_range(int(ids[0]), rows)

    def write_range(self, lo: int, rows: torch.Tensor) -> None:
        """Copies the rows out at once: the caller may reuse or modify `rows` as soon as this returns."""
        if self.offset + lo * self.row_bytes != self._at + self._fill:
            raise ValueError(f"{self.path.name}: rows must be written in order (got row {lo})")
        data = memoryview(np.ascontiguousarray(rows.numpy(), dtype=self.dtype)).cast("B")
        while len(data):
            take = min(len(data), _CHUNK - self._fill)
            self._buf[self._fill : self._fill + take] = data[:take]
            self._fill += take
            data = data[take:]
            if self._fill == _CHUNK:
                self._flush()

    def _flush(self) -> None:
        buf, fill, at = self._buf, self._fill, self._at
        fd, direct = self._fd, self.direct

        def job():
            whole = fill - fill % ALIGN if direct else fill
            _pwrite_all(fd, memoryview(buf)[:whole], at)
            if whole < fill:  # the file's unaligned tail, through the page cache
                tail_fd = os.open(self.path, os.O_WRONLY)
                try:
                    _pwrite_all(tail_fd, memoryview(buf)[whole:fill], at + whole)
                finally:
                    os.close(tail_fd)
            self._free.put(buf)

        self._worker.submit(job)
        self._at, self._fill = at + fill, 0
        self._buf = self._free.get()

    def release(self) -> None:
        pass

    def close(self) -> None:
        """Waits for every write; raises if one failed or the file was not filled to its last row."""
        if self._fd is None:
            return
        try:
            if self._fill:
                self._flush()
            self._worker.join()
        finally:
            os.close(self._fd)
            self._fd = None
        if self._at != self._end:
            raise ValueError(
                f"{self.path.name}: {self._at - self.offset} of {self._end - self.offset} bytes written"
            )


def _pwrite_all(fd: int, data: memoryview, at: int) -> None:
    while len(data):
        done = os.pwrite(fd, data, at)
        data, at = data[done:], at + done


class StreamReader:
    """Rows of an existing layer file in ascending batches [0, b), [b, 2b), ..., read ahead by a thread.

    batch(lo, hi) returns a read-only view that stays valid until the next call.
    """

    def __init__(self, path: str | Path, batch_rows: int):
        self.path = Path(path)
        self.offset, shape, dtype = _header_len(self.path)
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)
        self.row_bytes = int(np.prod(self.shape[1:])) * self.dtype.itemsize
        self.batch_rows = batch_rows
        self._fd, self.direct = _open_direct(self.path, os.O_RDONLY)
        need = batch_rows * self.row_bytes + 2 * ALIGN
        self._bufs = [mmap.mmap(-1, need + (-need) % ALIGN) for _ in range(_DEPTH + 2)]
        self._ready: queue.Queue = queue.Queue(maxsize=_DEPTH)
        self._stop = False
        self.error: BaseException | None = None
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self) -> None:
        try:
            n = self.shape[0]
            for i, lo in enumerate(range(0, n, self.batch_rows)):
                if self._stop:
                    return
                hi = min(lo + self.batch_rows, n)
                start = self.offset + lo * self.row_bytes
                end = self.offset + hi * self.row_bytes
                a = start - start % ALIGN if self.direct else start
                b = end + (-end) % ALIGN if self.direct else end
                buf = self._bufs[i % len(self._bufs)]
                view = memoryview(buf)[: b - a]
                got = 0
                while got < end - a:
                    done = os.preadv(self._fd, [view[got:]], a + got)
                    if done == 0:
                        raise EOFError(f"{self.path} ends before row {hi}")
                    got += done
                arr = np.frombuffer(
                    buf,
                    dtype=self.dtype,
                    count=(hi - lo) * self.row_bytes // self.dtype.itemsize,
                    offset=start - a,
                )
                self._ready.put((lo, hi, arr.reshape((hi - lo,) + self.shape[1:])))
        except BaseException as exc:  # noqa: BLE001 - handed to the reading thread
            self.error = exc
            self._ready.put(None)

    def batch(self, lo: int, hi: int) -> torch.Tensor:
        item = self._ready.get()
        if item is None:
            raise self.error
        got_lo, got_hi, arr = item
        if (got_lo, got_hi) != (lo, hi):
            raise ValueError(f"{self.path.name}: asked rows {lo}:{hi}, next batch is {got_lo}:{got_hi}")
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # read-only view: never written through
            return torch.from_numpy(arr)

    def close(self) -> None:
        self._stop = True
        while self._t.is_alive():  # unblock a thread waiting to hand over a batch
            try:
                self._ready.get(timeout=0.05)
            except queue.Empty:
                pass
        os.close(self._fd)
