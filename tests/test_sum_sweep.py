"""The first-layer sums' passes (training/sum_sweep.py): batches come out in order with exactly DGL's sums of
their first block, cohorts alternate so that a pass serves half the batches the budget holds (an odd count
included), and a failing read reaches the caller."""

from __future__ import annotations

import dgl
import numpy as np
import pytest
import torch

from gnnscale.sampling.batch import Batch
from gnnscale.sampling.neighbor import NeighborBlockSampler
from gnnscale.storage.csc import open_csc
from gnnscale.storage.feature_reader import FeatureReader
from gnnscale.storage.feature_store import FeatureStore
from gnnscale.storage.graph_dir import GraphDir
from gnnscale.training.batches import BatchStream
from gnnscale.training.sum_sweep import SumSweep, batch_bytes

COUNT = 23


class SampledLoader:
    """The same seeded batches every time it is iterated (fresh objects: the sweep takes their blocks)."""

    def __init__(self, g, n: int):
        self.g, self.n = g, n

    def __iter__(self):
        dgl.seed(7)
        sampler = NeighborBlockSampler([4, 3], by_source=True)
        seeds = torch.randperm(self.n, generator=torch.Generator().manual_seed(1))
        for i in range(COUNT):
            inp, out, blocks = sampler.sample_blocks(self.g, seeds[i * 16 : (i + 1) * 16])
            yield Batch(inp, out, blocks=blocks)

    def __len__(self) -> int:
        return COUNT


@pytest.fixture
def setup(tiny_graph):
    g = GraphDir(tiny_graph)
    ip, ix = (np.array(a, dtype=np.int64) for a in open_csc(g))
    n = len(ip) - 1
    graph = dgl.graph(("csc", (torch.from_numpy(ip), torch.from_numpy(ix), torch.empty(0, dtype=torch.int64))), num_nodes=n)  # fmt: skip
    return g, graph, n


@pytest.mark.parametrize("held,passes", [(2, COUNT), (6, 8), (7, 7), (100, 1)])
def test_summed_batches_equal_dgl_sums_and_share_passes(setup, held, passes):
    g, graph, n = setup
    store = FeatureStore(g)
    x = FeatureStore(g, in_memory=True).gather(torch.arange(n))
    want = [
        (b.seeds, dgl.ops.copy_u_sum(b.blocks[0], x[b.input_nodes]), x[b.input_nodes[: b.blocks[0].num_dst_nodes()]])
        for b in SampledLoader(graph, n)
    ]  # fmt: skip
    per = batch_bytes(next(iter(SampledLoader(graph, n))), store.stored_dim)  # the sweep sizes by the first
    sweep = SumSweep(store, FeatureReader(g), held * per + per // 2)
    stream = BatchStream(lambda: SampledLoader(graph, n), store, None, prefetch=0, sweeper=sweep)
    got = list(stream)
    assert len(got) == COUNT
    for b, (seeds, sums, own) in zip(got, want, strict=True):
        assert torch.equal(b.seeds, seeds)  # in order
        assert torch.equal(b.first[0], sums) and torch.equal(b.first[1], own)
    st = sweep.stats()
    # 7 held: cohorts of 4, 3, 4, 3, ... (7 passes for 23 batches); 6 held: 3 each (8 passes)
    assert st["batches_held"] == held and st["passes"] == passes
    stream.close()


def test_a_failing_read_reaches_the_caller(setup):
    g, graph, n = setup
    store = FeatureStore(g)

    class Broken(FeatureReader):
        def _read_request(self, *args):
            raise OSError(5, "Input/output error")

    per = batch_bytes(next(iter(SampledLoader(graph, n))), store.stored_dim)
    stream = BatchStream(
        lambda: SampledLoader(graph, n), store, None, prefetch=0, sweeper=SumSweep(store, Broken(g), 4 * per)
    )
    with pytest.raises(OSError, match="Input/output error"):
        list(stream)
    stream.close()
