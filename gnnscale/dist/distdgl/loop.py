"""A DistDGL trainer's batches as gnnscale Batches, so its epochs and evaluation are training/loop.py's
(the single-process loop) with DDPSync (dist/ddp.py) for the gradients, the sums and the gathered scores.

Every trainer takes the same number of steps (DDP waits for every rank at every step): the caller hands
each one the same number of seeds. Evaluation needs no lockstep: each trainer scores its share of the
split and the results are gathered before scoring, so every rank sees the same metric.
"""

from __future__ import annotations

import time

from gnnscale.sampling.batch import Batch


class DistBatches:
    """DistNodeDataLoader's (input_nodes, seeds, blocks), features and labels pulled from the DistGraph."""

    def __init__(self, g, loader, num_batches: int | None = None):
        self.g, self.loader, self.num_batches = g, loader, num_batches

    def __len__(self) -> int:
        return self.num_batches if self.num_batches is not None else len(self.loader)

    def __iter__(self):
        t_prev = time.perf_counter()
        for input_nodes, seeds, blocks in self.loader:
            t0 = time.perf_counter()
            b = Batch(input_nodes, seeds, blocks=blocks)
            b.x, b.y = self.g.ndata["feat"][input_nodes], self.g.ndata["label"][seeds]
            b.sample_s, b.gather_s = t0 - t_prev, time.perf_counter() - t0
            yield b
            t_prev = time.perf_counter()
