"""One layer's rows for every node as a memory-mapped .npy, resident ('memory') or streamed ('disk').

Both modes write the rows into a shared file mapping, so they are page cache, never anonymous heap:
the kernel can write them back and drop them, and the file is the per-layer cache `--update` reuses.
'memory' keeps the mapping populated (fast re-reads). 'disk' drops this process's pages after every
batch (MADV_DONTNEED; dirty pages are handed to the page cache, not lost), so the resident set stays
at one batch's rows whatever the graph size, and advises the rows it writes out of the page cache once
written back (a memory cgroup counts that cache against the run).
"""

from __future__ import annotations

import mmap
import os
import shutil
from pathlib import Path

import numpy as np
import torch


def plan_storage(num_nodes: int, dims: list[int], budget, storage: str) -> tuple[str, str, int]:
    """('memory' | 'disk', why, bytes) for layer arrays of widths dims[1:], input rows dims[0] included.
    budget: a utils.memlimit.Budget (infer.memory_budget)."""
    # The largest pair of arrays one layer holds at once: its input rows and its output rows.
    pair = max((dims[i] + dims[i + 1]) * 4 * num_nodes for i in range(len(dims) - 1))
    need_gb = pair / 1e9
    if storage in ("memory", "disk"):
        return storage, f"infer.storage={storage} (one layer's input + output = {need_gb:.2f} GB)", pair
    what = f"one layer's input + output = {num_nodes:,} x {pair // (4 * num_nodes)} x 4 B = {need_gb:.2f} GB"
    if pair <= budget.bytes:
        return "memory", f"{what} fits the memory budget {budget.bytes / 1e9:.2f} GB ({budget.why})", pair
    return "disk", f"{what} exceeds the memory budget {budget.bytes / 1e9:.2f} GB ({budget.why})", pair


def _header_len(path: Path) -> tuple[int, tuple, np.dtype]:
    with open(path, "rb") as fh:
        version = np.lib.format.read_magic(fh)
        read = (
            np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        )
        shape, fortran, dtype = read(fh)
        if fortran:
            raise ValueError(f"{path} is Fortran-ordered")
        return fh.tell(), shape, dtype


_BEHIND = 4  # 'disk' mode: the writes whose pages are advised out again (write_range)
ALIGN = 4096  # where a layer file's rows start: O_DIRECT (streamfile.py) wants page-aligned offsets


def create_layer_file(path: Path, shape: tuple, dtype=np.float32) -> int:
    """A new .npy of `shape` whose header is padded so the data starts at ALIGN; returns that offset.

    np.load reads it like any other .npy (version 1.0 allows headers up to 64 KiB).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    header = repr(
        {
            "descr": np.lib.format.dtype_to_descr(np.dtype(dtype)),
            "fortran_order": False,
            "shape": tuple(int(x) for x in shape),
        }
    )
    prefix = np.lib.format.MAGIC_PREFIX + bytes([1, 0])
    pad = ALIGN - len(prefix) - 2 - len(header) - 1
    raw = (header + " " * pad + "\n").encode("latin1")
    with open(path, "wb") as fh:
        fh.write(prefix + len(raw).to_bytes(2, "little") + raw)
        fh.truncate(ALIGN + int(np.prod(shape)) * np.dtype(dtype).itemsize)
    _preallocate(path)
    return ALIGN


def _preallocate(path: Path) -> None:
    """Reserve the file's blocks up front: first writes into a sparse file's mapping cost ~4x more (ext4)."""
    fd = os.open(path, os.O_RDWR)
    try:
        os.posix_fallocate(fd, 0, os.fstat(fd).st_size)
    except OSError:
        pass  # a filesystem without fallocate: the mapping still works, only slower to fill
    finally:
        os.close(fd)


class LayerFile:
    """A [rows, dim] float32 .npy opened through our own mmap, so pages can be dropped on demand."""

    def __init__(
        self,
        path: str | Path,
        shape: tuple[int, int] | None = None,
        mode: str = "memory",
        writable: bool = True,
        dtype=np.float32,
    ):
        self.path = Path(path)
        self.mode = mode
        if shape is not None:
            create_layer_file(self.path, shape, dtype)
        offset, shape, dtype = _header_len(self.path)
        self.shape, self.offset, self.row_bytes = (
            tuple(shape),
            offset,
            int(np.prod(shape[1:])) * dtype.itemsize,
        )
        self._fh = open(self.path, "r+b" if writable else "rb")
        self._behind: list[tuple[int, int]] = []  # 'disk': recent writes, dropped once written back
        self._mm = mmap.mmap(self._fh.fileno(), 0, access=mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ)
        self.array = np.ndarray(self.shape, dtype=dtype, buffer=self._mm, offset=offset)
        if not writable:
            self.array.flags.writeable = False
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # a read-only mapping: we never write through it
            self.tensor = torch.from_numpy(self.array)

    def gather(self, ids: torch.Tensor) -> torch.Tensor:
        return torch.index_select(self.tensor, 0, ids)

    def write(self, ids: np.ndarray, rows: torch.Tensor) -> None:
        """Rows for sorted ids: one pwrite for a contiguous run, else a scatter through the mapping."""
        if len(ids) == 0:
            return
        lo, hi = int(ids[0]), int(ids[-1]) + 1
        if hi - lo == len(ids):
            self.write_range(lo, rows)
        else:
            self.tensor.index_copy_(0, torch.from_numpy(np.asarray(ids, dtype=np.int64)), rows)

    def write_range(self, lo: int, rows: torch.Tensor) -> None:
        """Rows lo.. with pwrite, not stores into the mapping: the first store to each page of a fresh file
        mapping takes a page fault (ext4 page_mkwrite, block allocation), which cost 0.3-2 s per 512 MB on
        the 500k-node benchmark against 0.12 s for the same bytes through pwrite (one copy, no faults).
        The page cache is the same one the mapping reads, so readers of `tensor` see the rows at once."""
        buf = memoryview(np.ascontiguousarray(rows.numpy(), dtype=self.array.dtype)).cast("B")
        assert len(buf) == len(rows) * self.row_bytes, (len(buf), len(rows), self.row_bytes)
        at, fd = self.offset + lo * self.row_bytes, self._fh.fileno()
        start, nbytes = at, len(buf)
        while len(buf):  # pwrite may write less than asked (signals, very large requests)
            done = os.pwrite(fd, buf, at)
            buf, at = buf[done:], at + done
        if self.mode == "disk":
            self._write_behind(start, nbytes)

    def _write_behind(self, at: int, nbytes: int) -> None:
        """'disk' mode: keep the file's dirty page cache to a few writes. A memory cgroup counts dirty
        pages and its reclaim cannot write them back (cgroup v1), so they piled up to 60 MB beside a
        capped run's heap until the kernel killed it. fadvise(DONTNEED) starts a range's writeback and
        drops what of it is clean; each write re-advises the last few, written back by then."""
        self._behind = [*self._behind[-(_BEHIND - 1) :], (at, nbytes)]
        for a, n in self._behind:
            os.posix_fadvise(self._fh.fileno(), a, n, os.POSIX_FADV_DONTNEED)

    def release(self) -> None:
        """'disk' mode: drop this process's mapped pages (the data stays in the file / page cache)."""
        if self.mode == "disk":
            self._mm.madvise(mmap.MADV_DONTNEED)

    def close(self) -> None:
        """Unmap. No msync: a shared mapping's writes are already the file's page cache, visible to every
        reader; durability is the publisher's fsync (one per finished file, outside the compute loop)."""
        self.tensor = None
        self.array = None
        try:
            self._mm.close()
        except BufferError:
            pass  # a caller still holds a view; the mapping closes when it goes
        self._fh.close()


def seed_unaffected_rows(
    base: Path, out: Path, affected: np.ndarray, num_nodes: int, chunk: int = 1 << 16
) -> None:
    """A new layer file holding the base run's rows wherever `affected` (sorted ids) will not overwrite them.

    Mostly unaffected: copy the whole file in the kernel (sendfile). Mostly affected: copy just the
    unaffected rows, so an update that reaches nearly every node does not pay for a full copy first.
    """
    if len(affected) <= num_nodes // 2:
        shutil.copyfile(base, out)
        return
    src = LayerFile(base, writable=False)
    dst = LayerFile(out, shape=src.shape)
    keep = np.ones(num_nodes, dtype=bool)
    keep[affected] = False
    rows = np.flatnonzero(keep)
    for lo in range(0, len(rows), chunk):
        ids = rows[lo : lo + chunk]
        dst.write(ids, src.gather(torch.from_numpy(ids)))
    src.close()
    dst.close()
