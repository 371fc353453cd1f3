"""Features read a superbatch ahead (train.feature_cache=read): every batch gets exactly the rows an
in-memory gather gives, whatever the superbatch size, hot cache or degree column, and a train run reads
the same numbers as one with the features in RAM."""

from __future__ import annotations

import json

import pytest
import torch

from gnnscale.sampling.batch import Batch
from gnnscale.stages import train
from gnnscale.storage.csc import open_csc
from gnnscale.storage.feature_reader import FeatureReader
from gnnscale.storage.feature_store import FeatureStore
from gnnscale.storage.graph_dir import GraphDir
from gnnscale.training.batches import BatchStream
from gnnscale.training.staging import Stager
from tests.conftest import compose

COMPUTED = ("epoch", "loss", "train_acc", "lr", "val_acc", "val_loss", "steps", "best")


def random_batches(n: int, count: int, seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [
        torch.unique(torch.randint(0, n, (int(s),), generator=gen))
        for s in torch.randint(1, 200, (count,), generator=gen)
    ]


class FixedLoader:
    """A loader of batches with given input nodes (what a sampler yields, minus the structure)."""

    def __init__(self, inputs: list[torch.Tensor]):
        self.inputs = inputs

    def __iter__(self):
        return (Batch(input_nodes=ids[torch.randperm(len(ids))], seeds=ids[:1]) for ids in self.inputs)

    def __len__(self) -> int:
        return len(self.inputs)


@pytest.mark.parametrize(
    "row_cap,max_batches,hot,degree,overlap",
    [
        (1, 1, 0, False, True),
        (150, 4, 0, False, True),
        (400, 64, 0, False, True),
        (10_000, 64, 0, False, True),
        (200, 8, 120, True, True),
        (150, 4, 0, False, False),
        (200, 8, 120, True, False),
    ],
)
def test_staged_batches_equal_in_memory_gathers(tiny_graph, row_cap, max_batches, hot, degree, overlap):
    g = GraphDir(tiny_graph)
    indptr = open_csc(g)[0] if degree else None
    in_ram = FeatureStore(g, in_memory=True, degree_indptr=indptr)
    store = FeatureStore(g, degree_indptr=indptr)
    if hot:
        store.cache_hottest(hot, open_csc(g)[0])
    inputs = random_batches(600, 23, seed=row_cap)
    torch.manual_seed(0)
    stager = Stager(store, FeatureReader(g), row_cap, max_batches, overlap, adaptive=False)
    stream = BatchStream(lambda: FixedLoader(inputs), store, None, prefetch=0, stager=stager)
    for _ in range(2):  # a second pass reuses the buffers
        seen = 0
        for b in stream:
            assert torch.equal(b.x, in_ram.gather(b.input_nodes))
            seen += 1
        assert seen == len(inputs)
    st = stager.stats()
    # Every row was staged at least once; in halves, rows shared with the previous superbatch were copied,
    # not read again; with one buffer nothing is carried. A batch larger than a half (up to 199 rows
    # here) takes the whole region and carries nothing either.
    assert st["rows_read"] + st["rows_copied"] >= len(torch.unique(torch.cat(inputs))) - hot
    if not overlap:
        assert st["rows_copied"] == 0 and st["whole_region_reads"] == st["superbatches"]
    elif row_cap == 1:  # one batch a superbatch: only a one-row batch fits a half
        assert st["whole_region_reads"] == 2 * sum(len(x) > row_cap for x in inputs)
    elif 200 <= row_cap < 10_000:
        assert st["rows_copied"] > 0 and st["whole_region_reads"] == 0
    if max_batches == 1:
        assert st["superbatches"] == 2 * len(inputs)
    if row_cap >= 10_000:
        assert st["superbatches"] == 2  # the whole pass in one superbatch (23 batches < 64)
    stream.close()


class Alternating(Stager):
    """Halves and the whole region in turn, whatever the timings: every transition is taken."""

    def observe(self, batches: int, read_s: float, compute_s: float) -> None:
        self.switches += 1
        self.halves = not self.halves


def test_switching_between_halves_and_the_whole_region_keeps_every_row(tiny_graph):
    g = GraphDir(tiny_graph)
    in_ram, store = FeatureStore(g, in_memory=True), FeatureStore(g)
    inputs = random_batches(600, 31, seed=7)
    stager = Alternating(store, FeatureReader(g), 250, 4)
    stream = BatchStream(lambda: FixedLoader(inputs), store, None, prefetch=0, stager=stager)
    for _ in range(2):
        assert all(torch.equal(b.x, in_ram.gather(b.input_nodes)) for b in stream)
    st = stager.stats()
    assert st["whole_region_reads"] > 0 and st["whole_region_reads"] < st["superbatches"]
    assert st["rows_copied"] > 0  # halves after halves still carry shared rows
    stream.close()


def test_the_whole_region_is_taken_when_the_read_outweighs_compute(tiny_graph):
    g = GraphDir(tiny_graph)
    s = Stager(FeatureStore(g), FeatureReader(g), 100, 4)
    s.observe(4, read_s=1.0, compute_s=0.6)  # read 0.25 s a batch, compute 0.15: halves hide it
    assert s.halves
    s.observe(4, read_s=1.3, compute_s=0.6)  # read over twice the compute
    assert not s.halves and s.switches == 1
    s.observe(4, read_s=0.4, compute_s=0.6)  # under twice, not yet under half: stays
    assert not s.halves
    s.observe(4, read_s=0.2, compute_s=0.6)
    assert s.halves and s.switches == 2
    pinned = Stager(FeatureStore(g), FeatureReader(g), 100, 4, adaptive=False)
    pinned.observe(4, read_s=10.0, compute_s=0.1)
    assert pinned.halves


def _run(graph, tmp_path, name: str, *extra: str, exp: str = "sage_2hop") -> tuple[list[dict], dict, dict]:
    run_dir = tmp_path / name
    s = train.run(
        compose(
            "train", f"graph_dir={graph}", f"run_dir={run_dir}", f"+exp={exp}", "train.epochs=2",
            "train.batch_size=64", "train.eval_batch_size=64", *extra,
        )
    )  # fmt: skip
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    weights = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)["model"]
    return lines, s, weights


def test_training_with_features_read_ahead_equals_features_in_ram(tiny_graph, tmp_path):
    ram, s_ram, w_ram = _run(tiny_graph, tmp_path, "ram", "train.feature_cache=memory")
    read, s_read, w_read = _run(tiny_graph, tmp_path, "read", "train.feature_cache=read")
    assert s_read["memory_plan"]["feature_cache"] == "read" and s_read["memory_plan"]["stage_rows"] > 0
    assert [{k: r.get(k) for k in COMPUTED} for r in read] == [{k: r.get(k) for k in COMPUTED} for r in ram]
    assert w_ram.keys() == w_read.keys() and all(torch.equal(w_ram[k], w_read[k]) for k in w_ram)
    assert s_read["test_acc"] == s_ram["test_acc"]


def test_link_training_with_features_read_equals_features_in_ram(tiny_graph, tmp_path):
    """Link batches draw negatives from torch's RNG: staged one at a time, each sampled after the batch
    before it computed, the run equals the in-memory one."""
    link = ("task=link", "sampler.fanouts=[5,5]")
    ram, _, w_ram = _run(
        tiny_graph, tmp_path, "link_ram", *link, "train.feature_cache=memory", exp="sage_link"
    )
    read, s_read, w_read = _run(
        tiny_graph, tmp_path, "link_read", *link, "train.feature_cache=read", exp="sage_link"
    )
    assert s_read["memory_plan"]["feature_cache"] == "read"
    drop = ("time_s", "seeds_per_s", "sample_s", "gather_s", "data_wait_s", "forward_s", "backward_s")
    keep = [k for k in ram[0] if k not in drop and not k.endswith(("_s", "_per_s", "_mb"))]
    assert [{k: r.get(k) for k in keep} for r in read] == [{k: r.get(k) for k in keep} for r in ram]
    assert all(torch.equal(w_ram[k], w_read[k]) for k in w_ram)


def test_auto_reads_ahead_when_features_do_not_fit(tiny_graph, tmp_path):
    """A budget that holds everything but the feature matrix: auto picks read and says so."""
    from gnnscale.training.memory_plan import BatchShape, Sizes, Workload, estimate, plan
    from gnnscale.utils.memlimit import Budget

    sizes = Sizes(num_nodes=5_000_000, feat_dim=128, feat_itemsize=4, csc_bytes=820_000_000,
                  dims=(128, 256, 16), num_params=100_000, input_dropout=False)  # fmt: skip
    shape = BatchShape(150_000, (15_000, 1024), (150_000, 10_000))
    w = Workload(sizes, shape, shape, 400 << 20, 0)
    lean = estimate(w, "read", 0, Budget(10**12, "t"), structure="memory")
    p, said = plan(w, "auto", 0, Budget(lean.must_fit + 600_000_000, "t"))
    assert p.fits and p.feature_cache == "read" and p.structure == "memory"
    assert said[0].startswith("features read from disk a superbatch ahead")
    assert p.stage_rows > shape.input_rows and 1 < p.stage_batches <= 64
    assert p.must_fit <= p.budget.bytes
    assert "read a superbatch ahead" in p.line() and "graph structure in RAM" in p.line()
    # The staging buffers take their share of the room, not more.
    staged = p.parts["staged rows (2 superbatches)"] + p.parts["superbatch blocks"]
    assert (
        staged - lean.parts["staged rows (2 superbatches)"] - lean.parts["superbatch blocks"] <= 600_000_000
    )
