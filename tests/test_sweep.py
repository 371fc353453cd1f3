"""Features read by the sweep (train.feature_cache=read): every batch gets exactly the rows an in-memory
gather gives, whatever the rows held, batches in flight, chunk size, hot cache or degree column; the rows
held never pass their cap; a train run reads the same numbers as one with the features in RAM."""

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
from gnnscale.training.sweep import Sweeper, flight_target
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


class CappedSweeper(Sweeper):
    """Records the most rows the batches in flight held (reserved for a read or handed over)."""

    most = 0

    def _plan(self):
        planned = super()._plan()
        self.most = max(self.most, self._held)
        return planned


@pytest.mark.parametrize("dense", [True, False], ids=["dense", "sparse"])
@pytest.mark.parametrize(
    "row_cap,max_batches,chunk_rows,hot,degree,lookahead",
    [
        (1, 1, 7, 0, False, True),  # one batch in flight, over the cap alone: it still completes
        (150, 4, 50, 0, False, True),  # batches of up to 199 rows against 150 held: evictions
        (400, 64, 64, 0, False, True),
        (10_000, 64, 0, 0, False, True),  # a shard a chunk
        (200, 8, 33, 120, True, True),  # hot-feature cache and the degree column
        (300, 8, 20, 0, False, False),  # lookahead=False: one in flight
    ],
)
def test_swept_batches_equal_in_memory_gathers(
    tiny_graph, row_cap, max_batches, chunk_rows, hot, degree, lookahead, dense
):
    g = GraphDir(tiny_graph)
    indptr = open_csc(g)[0] if degree else None
    in_ram = FeatureStore(g, in_memory=True, degree_indptr=indptr)
    store = FeatureStore(g, degree_indptr=indptr)
    if hot:
        store.cache_hottest(hot, open_csc(g)[0])
    inputs = random_batches(600, 23, seed=row_cap)
    sweeper = CappedSweeper(
        store, FeatureReader(g), row_cap, max_batches, lookahead=lookahead, chunk_rows=chunk_rows, dense=dense
    )
    stream = BatchStream(lambda: FixedLoader(inputs), store, None, prefetch=0, sweeper=sweeper)
    for _ in range(2):  # a second pass starts the sweep again
        seen = 0
        for b in stream:
            assert torch.equal(b.x, in_ram.gather(b.input_nodes))
            seen += 1
        assert seen == len(inputs)
    st = sweeper.stats()
    assert st["reads"] == ("dense" if dense and lookahead else "sparse")
    assert st["batches"] == 2 * len(inputs)
    # Every row the batches need was read by the sweep at least once (hot-cache rows are never read).
    assert st["rows_read"] >= len(torch.unique(torch.cat(inputs))) - hot
    # The rows held stay under the cap but for the oldest batch, which always takes its own rows.
    assert sweeper.most <= row_cap + max(len(x) for x in inputs)
    if not lookahead or max_batches == 1:
        assert st["in_flight_mean"] == 1.0
    elif row_cap < 200:
        assert st["rows_evicted"] > 0  # younger batches gave their rows back to the oldest
    if row_cap >= 10_000:
        assert st["rows_evicted"] == 0 and st["in_flight_mean"] > 1
    if row_cap < min(len(x) for x in inputs):  # one batch outgrows the pool: it grew, nothing was lost
        assert st["pool_grown"] > 0
    stream.close()


@pytest.mark.parametrize("dense", [True, False], ids=["dense", "sparse"])
def test_rows_many_batches_need_are_held_once(tiny_graph, dense):
    """Batches that need the same rows share one copy of each: the pool never holds more rows than the
    batches' union, where a copy per batch would hold one per batch in flight; and as the rows held leave
    room, more batches join (the count follows the rows really held, not a copy per batch)."""
    g = GraphDir(tiny_graph)
    in_ram = FeatureStore(g, in_memory=True)
    store = FeatureStore(g)
    common = random_batches(600, 1, seed=3)[0]
    inputs = [common] * 60
    sweeper = CappedSweeper(store, FeatureReader(g), 3 * len(common), 20, chunk_rows=50, dense=dense)
    stream = BatchStream(lambda: FixedLoader(inputs), store, None, prefetch=0, sweeper=sweeper)
    for b in stream:
        assert torch.equal(b.x, in_ram.gather(b.input_nodes))
    st = sweeper.stats()
    assert sweeper.most <= len(common)
    # a copy each reads every batch's rows; shared, a chunk's rows are read once for all who take it
    assert st["rows_read"] < len(inputs) * len(common) / 3 and st["rows_found_held"] > 0
    assert st["batches_wanted"] > flight_target(3 * len(common), len(common), 20)  # what a copy each allows
    stream.close()


def test_gather_of_rows_read_ahead_fills_exactly_the_rows_asked(tiny_graph):
    """FeatureStore.gather(staged=(positions, source, index)): source[index[k]] lands at positions[k], with
    or without the hot cache taking some rows, and rows the staged ones leave uncovered are refused."""
    g = GraphDir(tiny_graph)
    in_ram = FeatureStore(g, in_memory=True)
    ids = torch.randperm(600, generator=torch.Generator().manual_seed(0))[:90]
    source = torch.cat([torch.zeros(5, in_ram.feat_dim), in_ram.gather(ids.flip(0))])  # rows at 5.. reversed
    everywhere = torch.arange(90)
    index = 5 + 89 - everywhere
    assert torch.equal(FeatureStore(g).gather(ids, staged=(everywhere, source, index)), in_ram.gather(ids))
    hot = FeatureStore(g)
    hot.cache_hottest(200, open_csc(g)[0])
    rest = (hot.hot_slot[ids] < 0).nonzero().squeeze(1)
    assert 0 < len(rest) < len(ids)
    assert torch.equal(hot.gather(ids, staged=(rest, source, index[rest])), in_ram.gather(ids))
    with pytest.raises(RuntimeError, match="cover"):
        hot.gather(ids, staged=(rest[1:], source, index[rest[1:]]))


@pytest.mark.parametrize("dense", [True, False], ids=["dense", "sparse"])
def test_a_failing_read_reaches_the_caller(tiny_graph, dense):
    g = GraphDir(tiny_graph)
    store = FeatureStore(g)

    class Broken(FeatureReader):
        def read_rows(self, ids, out=None):
            raise OSError(5, "Input/output error")

        def _read_request(self, *args):
            raise OSError(5, "Input/output error")

    stream = BatchStream(
        lambda: FixedLoader(random_batches(600, 3, seed=1)), store, None, prefetch=0,
        sweeper=Sweeper(store, Broken(g), 100, 4, dense=dense),
    )  # fmt: skip
    with pytest.raises(OSError, match="Input/output error"):
        list(stream)
    stream.close()


def _run(graph, tmp_path, name: str, *extra: str, exp: str = "sage_2hop") -> tuple[list[dict], dict, dict]:
    run_dir = tmp_path / name
    s = train.run(
        compose(
            "train", f"graph_dir={graph}", f"run_dir={run_dir}", f"+exp={exp}", "train.epochs=2",
            "train.batch_size=64", *extra,
        )
    )  # fmt: skip
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    weights = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)["model"]
    return lines, s, weights


@pytest.mark.parametrize(
    "extra, mode",
    [
        ((), "sweep"),  # the small-graph profile's input dropout: the rows themselves are read ahead
        (("train.few_labels.below=0",), "first-layer sums"),  # SAGE mean, 8 -> 256: its sums are
        (("train.few_labels.below=0", "model.aggregator=gcn", "model.norm=none"), "first-layer sums"),
    ],
)
def test_training_with_features_read_ahead_equals_features_in_ram(tiny_graph, tmp_path, extra, mode):
    ram, s_ram, w_ram = _run(tiny_graph, tmp_path, "ram", "train.feature_cache=memory", *extra)
    read, s_read, w_read = _run(tiny_graph, tmp_path, "read", "train.feature_cache=read", *extra)
    planned = s_read["memory_plan"]
    assert planned["feature_cache"] == "read"
    # the plan prices what the run holds: the row sweep's pool, or the cohorts of first-layer sums
    assert (
        planned["stage_rows"] > 0
        if mode == "sweep"
        else planned["sums_bytes"] > 0 and "stage_rows" not in planned
    )
    assert s_read["feature_reads"]["mode"] == mode
    assert [{k: r.get(k) for k in COMPUTED} for r in read] == [{k: r.get(k) for k in COMPUTED} for r in ram]
    assert w_ram.keys() == w_read.keys() and all(torch.equal(w_ram[k], w_read[k]) for k in w_ram)
    assert s_read["test_acc"] == s_ram["test_acc"]  # evaluation batches summed alike (val_acc: COMPUTED)
    # train.eval_batch_size=0: the training batch size whatever the plan, so the metrics above agree
    assert planned["eval_batch_size"] == s_ram["memory_plan"]["eval_batch_size"] == 64


def test_link_training_with_features_read_equals_features_in_ram(tiny_graph, tmp_path):
    """Link batches draw negatives from torch's RNG: one in flight at a time, each sampled after the batch
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
    assert said[0].startswith("features read from disk ahead of the model")
    assert p.stage_rows > shape.input_rows and 1 < p.stage_batches <= 64
    assert p.must_fit <= p.budget.bytes
    assert "read from disk by a sweep" in p.line() and "graph structure in RAM" in p.line()
    # The rows read ahead and the blocks in flight take their share of the room, not more.
    ahead = p.parts["rows read ahead"] + p.parts["blocks in flight"]
    assert ahead - lean.parts["rows read ahead"] - lean.parts["blocks in flight"] <= 600_000_000
