"""First-layer sums added a chunk of the feature file at a time (training/first_sums.py) against DGL."""

from __future__ import annotations

import dgl
import numpy as np
import pytest
import torch

from gnnscale.models import GNN
from gnnscale.sampling.neighbor import NeighborBlockSampler
from gnnscale.training.first_sums import CohortSums

N, DIM = 600, 8
# uneven chunks, one of a single row, the last one ending at N
STARTS = np.array([0, 7, 120, 121, 300, 599, N])


@pytest.fixture(scope="module")
def graph():
    gen = torch.Generator().manual_seed(0)
    src = torch.randint(0, N, (9000,), generator=gen)
    dst = torch.randint(0, N, (9000,), generator=gen)
    return dgl.graph((src, dst), num_nodes=N).formats(["csc"])


def sample(graph, by_source: bool, batches: int = 3):
    dgl.seed(7)
    sampler = NeighborBlockSampler([6, 3], by_source=by_source)
    seeds = torch.randperm(N, generator=torch.Generator().manual_seed(1))
    return [sampler.sample_blocks(graph, seeds[i * 64 : (i + 1) * 64]) for i in range(batches)]


def edge_lists(block, input_nodes) -> list[list[int]]:
    ip, ind, _ = block.adj_tensors("csc")
    gsrc = input_nodes[ind].tolist()
    return [gsrc[ip[r] : ip[r + 1]] for r in range(block.num_dst_nodes())]


def cohort(batches, x, scratch=None) -> CohortSums:
    sums = CohortSums([(inp, blocks[0]) for inp, _, blocks in batches], STARTS, DIM, scratch=scratch)
    for c in range(len(STARTS) - 1):
        sums.add(c, x[STARTS[c] : STARTS[c + 1]].clone())
    return sums


def test_by_source_samples_the_same_edges_in_source_order(graph):
    plain, ordered = sample(graph, False), sample(graph, True)
    for (ip_, _, bp), (io, _, bo) in zip(plain, ordered, strict=True):
        assert torch.equal(ip_, io)  # the same input rows: only the edge order changes
        got, want = edge_lists(bo[0], io), edge_lists(bp[0], ip_)
        assert [sorted(w) for w in want] == got
        assert any(w != sorted(w) for w in want)  # DGL's own order is not sorted: the option does something
        assert edge_lists(bo[1], io) == edge_lists(bp[1], ip_)  # other layers untouched


@pytest.mark.parametrize("scratch_rows", [0, 3])  # 0: its own (one piece a chunk); 3: many pieces a chunk
def test_cohort_sums_equal_dgl_sums_bit_for_bit(graph, scratch_rows):
    x = torch.randn(N, DIM, generator=torch.Generator().manual_seed(2))
    batches = sample(graph, True)
    scratch = torch.full((scratch_rows * DIM,), float("nan")) if scratch_rows else None
    sums = cohort(batches, x, scratch)
    for i, (inp, _, blocks) in enumerate(batches):
        s, own, deg = sums.batch(i)
        assert torch.equal(s, dgl.ops.copy_u_sum(blocks[0], x[inp]))
        assert torch.equal(own, x[inp[: blocks[0].num_dst_nodes()]])
        assert torch.equal(deg, blocks[0].in_degrees().to(torch.int64))


@pytest.mark.parametrize("aggregator", ["mean", "gcn"])
def test_model_from_sums_equals_model_on_rows(graph, aggregator):
    x = torch.randn(N, DIM, generator=torch.Generator().manual_seed(3))
    batches = sample(graph, True)
    sums = cohort(batches, x)
    torch.manual_seed(0)
    model = GNN("sage", DIM, 16, 4, 2, aggregator=aggregator, dropout=0.5, norm="batch").train()
    for i, (inp, _, blocks) in enumerate(batches):
        outs, grads = [], []
        for first in (None, sums.batch(i)):
            torch.manual_seed(i)  # the same dropout masks both ways
            model.zero_grad()
            out = model(blocks, x[inp] if first is None else None, first=first)
            out.square().sum().backward()
            outs.append(out.detach())
            grads.append([p.grad.clone() for p in model.parameters()])
        assert torch.equal(outs[0], outs[1])
        assert all(torch.equal(a, b) for a, b in zip(*grads, strict=True))


def test_unsorted_first_block_is_refused(graph):
    batches = sample(graph, False)
    with pytest.raises(ValueError, match="ascending source id"):
        CohortSums([(inp, blocks[0]) for inp, _, blocks in batches], STARTS, DIM)


def test_fp16_rows_are_summed_as_float32(graph):
    x = torch.randn(N, DIM, generator=torch.Generator().manual_seed(4)).half()
    batches = sample(graph, True, batches=1)
    sums = cohort(batches, x)
    inp, _, blocks = batches[0]
    assert torch.equal(sums.batch(0)[0], dgl.ops.copy_u_sum(blocks[0], x[inp].float()))
