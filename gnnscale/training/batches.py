"""Mini-batches with their input features; feature gathers can run ahead in a background thread.

A loader yields `Batch`es (sampling/batch.py) with their structure; the stream fills in
x = features of input_nodes *in that order* (DGL lists each block's destination nodes first among
its sources, so row i of x is blocks[0]'s source node i) and y = labels of the seeds.

Determinism: sampling runs in the caller's thread, whose DGL OpenMP team dgl.seed reseeds as a
whole (the training loop reseeds with the same thread count it samples with); the blocks are
relabelled deterministically (sampling/neighbor.py); and the DataLoader is rebuilt each epoch (its
shuffle permutes the previous epoch's order in place, which a resumed process would not have).

Speed: rows are gathered with index_select into a ring of reused buffers (a fresh tensor per
batch costs page faults that dominate the gather), in a thread, `prefetch` batches ahead, while
the current batch computes (torch kernels release the GIL). With a thread the ring has prefetch + 2
slots: one in compute (autograd may read it until backward ends), up to prefetch + 1 being filled.
Inline (prefetch 0) one slot is enough: the next batch is gathered only once the consumer is done
with the current one.

Memory: a batch is let go before the next one is sampled: held, its blocks (and, when the ring grows,
its buffer) would sit beside the next batch's. The consumer lets go of its own references too
(training/loop.py). The train, val and test streams never run at the same time, so they share one ring
(`FeatureBuffers`); otherwise each would keep its own largest batch (evaluation batches are the
largest) for the whole run.
"""

from __future__ import annotations

import itertools
import time
import warnings
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterable, Iterator

import torch

from gnnscale.sampling.batch import Batch, next_sampled
from gnnscale.storage.feature_store import FeatureStore
from gnnscale.training.sum_sweep import SumSweep
from gnnscale.training.sweep import swept_batches
from gnnscale.training.threads import single_threaded


class FeatureBuffers:
    """A ring of reused gather buffers, each grown to the largest batch it has held."""

    def __init__(self, feat_dim: int, dtype: torch.dtype, prefetch: int, pin: bool = False):
        self.feat_dim, self.dtype, self.pin = feat_dim, dtype, pin
        self._slots: list[torch.Tensor | None] = [None] * (prefetch + 2 if prefetch > 0 else 1)
        self._next = 0

    def take(self, rows: int) -> torch.Tensor:
        k = self._next
        self._next = (k + 1) % len(self._slots)
        buf = self._slots[k]
        if buf is None or buf.shape[0] < rows:
            self._slots[k] = buf = None  # free the old one before allocating its successor
            # Grow with headroom: input-node counts vary a little from batch to batch.
            buf = torch.empty((int(rows * 1.25) + 16, self.feat_dim), dtype=self.dtype)
            if self.pin:
                buf = buf.pin_memory()
            self._slots[k] = buf
        return buf[:rows]


class BatchStream:
    def __init__(
        self,
        make_loader: Callable[[], Iterable[Batch]],
        features: FeatureStore,
        labels: torch.Tensor | None,
        *,
        prefetch: int = 1,
        device: torch.device | None = None,
        num_batches: int | None = None,
        buffers: FeatureBuffers | None = None,
        sweeper=None,
    ):
        self.make_loader = make_loader
        self.features = features
        self.labels = labels
        self.prefetch = max(0, int(prefetch))
        self.device = device or torch.device("cpu")
        pin = self.device.type == "cuda"
        self.buffers = buffers or FeatureBuffers(features.feat_dim, features.dtype, self.prefetch, pin)
        self._pool = (
            ThreadPoolExecutor(1, thread_name_prefix="gnnscale-gather", initializer=single_threaded)
            if self.prefetch
            else None
        )
        self._len = num_batches
        self._limit: int | None = None
        # feature_cache=read: training/sweep.Sweeper (rows read by a sweep ahead), or for a first layer that
        # sums before it projects training/sum_sweep.SumSweep (its sums added as the features are read)
        self.sweeper = sweeper
        if sweeper is not None:
            self.prefetch = 0  # the sweep reads ahead itself; gathers from what it read are memory copies

    def __len__(self) -> int:
        if self._len is None:
            self._len = len(self.make_loader())
        return self._len if self._limit is None else min(self._len, self._limit)

    def limit(self, num_batches: int) -> None:
        """At most num_batches per pass (data-parallel ranks must all run the same number)."""
        self._limit = int(num_batches)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        if self.sweeper is not None:
            self.sweeper.close()  # shared by a run's streams: closing it twice is harmless

    def _gather(self, b: Batch, out: torch.Tensor) -> Batch:
        t0 = time.perf_counter()
        if self.sweeper is not None:
            x = self.sweeper.gather(b.input_nodes, out)
        else:
            x = self.features.gather(b.input_nodes, out=out)
        if x.dtype != torch.float32:  # fp16/bf16-stored features: the model's weights are fp32
            x = x.float()
        b.x = x
        self._labelled(b)
        b.gather_s = time.perf_counter() - t0
        return b

    def __iter__(self) -> Iterator[Batch]:
        loader = self.make_loader()
        with warnings.catch_warnings():
            # DGL advises CPU affinity for its worker processes on every epoch of every CPU loader,
            # workers or not; gnnscale sizes its threads itself (train.num_threads).
            warnings.filterwarnings("ignore", message="Dataloader CPU affinity opt is not enabled")
            it = iter(loader)  # shuffles with numpy's RNG, in this thread, after the caller's reseed
        if self._limit is not None:
            it = itertools.islice(it, self._limit)
        if self.sweeper is not None:
            yield from self._swept(it)
            return
        pending: deque = deque()
        exhausted = False
        try:
            while True:
                while not exhausted and len(pending) <= self.prefetch:
                    b = next_sampled(it)
                    if b is None:
                        exhausted = True
                        break
                    out = self.buffers.take(len(b.input_nodes))
                    if self._pool is not None:
                        pending.append(self._pool.submit(self._gather, b, out))
                    else:
                        pending.append(self._gather(b, out))
                if not pending:
                    return
                job = pending.popleft()
                b = job.result() if self._pool is not None else job
                job = None
                yield b if self.device.type == "cpu" else b.to(self.device)
                b = None  # not held while the next batch is sampled and gathered (see Memory above)
        finally:
            for job in pending:  # let in-flight gathers finish before their buffers are reused
                if self._pool is not None:
                    job.result()

    def _labelled(self, b: Batch) -> None:
        if self.labels is not None:
            b.y = self.labels[b.seeds]

    def _swept(self, it: Iterator[Batch]) -> Iterator[Batch]:
        if isinstance(self.sweeper, SumSweep):
            batches = self.sweeper.stream(it, self._labelled)
        else:
            batches = swept_batches(self.sweeper, it, self.buffers.take, self._gather)
        for b in batches:
            yield b if self.device.type == "cpu" else b.to(self.device)
            b = None  # not held while the next batch is gathered (see Memory above)
