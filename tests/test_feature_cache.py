"""The hot-feature cache (train.cache_gb): same rows as the uncached store, the top in-degree nodes held,
hits counted right, planned within the memory budget, and a train run whose values do not change."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from gnnscale.stages import train
from gnnscale.storage.csc import open_csc
from gnnscale.storage.feature_store import FeatureStore, hottest_nodes
from gnnscale.storage.graph_dir import GraphDir
from gnnscale.training.memory_plan import CACHE_PART, BatchShape, Sizes, Workload, estimate, plan
from gnnscale.utils.memlimit import Budget
from tests.conftest import compose

# Computed values in a metrics.jsonl line (the rest are times, rates and memory readings).
COMPUTED = ("epoch", "loss", "train_acc", "lr", "val_acc", "val_loss", "steps", "best")


def stores(graph_dir, rows: int) -> tuple[FeatureStore, FeatureStore, torch.Tensor]:
    """(uncached, cached with `rows` hot rows, in-degrees)."""
    g = GraphDir(graph_dir)
    indptr, _ = open_csc(g)
    plain, cached = FeatureStore(g), FeatureStore(g)
    assert cached.cache_hottest(rows, indptr) == rows
    return plain, cached, torch.from_numpy(np.diff(np.asarray(indptr)))


@pytest.mark.parametrize("rows", [0, 1, 37, 300, 600])
def test_cached_gathers_equal_uncached_ones(tiny_graph, rows):
    plain, cached, _ = stores(tiny_graph, rows)
    gen = torch.Generator().manual_seed(rows)
    hot = hottest_nodes(open_csc(GraphDir(tiny_graph))[0], rows)
    cold = torch.tensor(sorted(set(range(600)) - set(hot.tolist())), dtype=torch.int64)
    cases = [
        torch.randint(0, 600, (n,), generator=gen)
        for n in (1, 50, 1000)  # repeats included
    ] + [torch.empty(0, dtype=torch.int64), hot, cold, torch.arange(599, -1, -1)]
    for ids in cases:
        want = plain.gather(ids)
        assert torch.equal(cached.gather(ids), want)
        out = torch.full((len(ids) + 5, plain.feat_dim), float("nan"))
        got = cached.gather(ids, out=out[: len(ids)])  # into a reused buffer, as the batch stream does
        assert torch.equal(got, want) and torch.isnan(out[len(ids) :]).all()
    with pytest.raises(IndexError):
        cached.gather(torch.tensor([600]))


def test_the_cache_holds_the_highest_in_degree_nodes(tiny_graph):
    _, cached, deg = stores(tiny_graph, 100)
    held = hottest_nodes(open_csc(GraphDir(tiny_graph))[0], 100)
    assert len(held) == 100 and len(set(held.tolist())) == 100
    assert bool((held[1:] > held[:-1]).all())  # sorted by id: read front to back when filled
    rest = torch.ones(600, dtype=torch.bool)
    rest[held] = False
    assert int(deg[held].min()) >= int(deg[rest].max())  # no uncached node has a higher in-degree
    assert cached.cache_rows == 100
    assert cached.cache_bytes == 100 * cached.feat_dim * 4 + 600 * 4  # rows + the int32 slot map


def test_hits_and_misses_are_counted_per_row(tiny_graph):
    _, cached, _ = stores(tiny_graph, 10)
    held = hottest_nodes(open_csc(GraphDir(tiny_graph))[0], 10)
    cold = [i for i in range(600) if i not in set(held.tolist())][:4]
    assert cached.cache_counts() == (0, 0)
    batch = torch.tensor([*held[:3].tolist(), *cold, int(held[0])])  # a repeat counts each time
    cached.gather(batch)
    assert cached.cache_counts() == (4, 4)
    cached.gather(torch.empty(0, dtype=torch.int64))
    cached.gather(held)
    assert cached.cache_counts() == (14, 4)


def test_a_store_with_features_in_ram_refuses_a_cache(tiny_graph):
    g = GraphDir(tiny_graph)
    with pytest.raises(ValueError, match="in RAM already"):
        FeatureStore(g, in_memory=True).cache_hottest(10, open_csc(g)[0])


# ---------------------------------------------------------------- the memory plan
SIZES = Sizes(
    num_nodes=1_000_000, feat_dim=256, feat_itemsize=4, csc_bytes=80_000_000, dims=(256, 128, 8),
    num_params=70_000, input_dropout=False,
)  # fmt: skip
SHAPE = BatchShape(input_rows=200_000, dst_rows=(20_000, 1024), edges=(200_000, 10_000))
W = Workload(SIZES, SHAPE, SHAPE, anon_now=300_000_000, mapped_now=0)
ROW = 256 * 4


def test_the_plan_counts_the_cache_and_shrinks_one_that_does_not_fit():
    base = estimate(W, "mmap", 0, Budget(10**12, "t"))
    want = 400_000  # rows: 410 MB
    full = estimate(W, "mmap", 0, Budget(10**12, "t"), cache_rows=want)
    assert full.parts[CACHE_PART] == want * ROW + 1_000_000 * 4
    assert full.must_fit - base.must_fit == full.parts[CACHE_PART]
    p, decided = plan(W, "mmap", 0, Budget(full.must_fit + 10, "t"), cache_rows=want)
    assert p.cache_rows == want and p.fits and decided == []
    room = base.must_fit + 100_000_000  # 100 MB left after the rest of training
    p, decided = plan(W, "mmap", 0, Budget(room, "t"), cache_rows=want)
    assert 0 < p.cache_rows < want and p.fits and p.as_dict()["cache_rows"] == p.cache_rows
    assert p.cache_rows == (100_000_000 - 4_000_000) // ROW
    assert len(decided) == 1 and decided[0].startswith("hot-feature cache 0.41 GB -> 0.10 GB: a larger one")
    p, decided = plan(W, "mmap", 0, Budget(base.must_fit + 1000, "t"), cache_rows=want)
    assert p.cache_rows == 0 and p.fits and "-> off" in decided[0]


def test_page_faults_read_only_their_page_when_the_mapped_files_do_not_fit():
    roomy = estimate(W, "mmap", 0, Budget(10**12, "t"))
    assert roomy.mapped_files_fit and roomy.as_dict()["mapped_files_fit"]
    # Fits (the CSC and one batch's pages), but the whole feature matrix would not stay cached beside it.
    tight = estimate(W, "mmap", 0, Budget(roomy.must_fit + 10, "t"))
    assert tight.fits and not tight.mapped_files_fit


def test_access_advice_changes_no_row(tiny_graph):
    plain, cached, _ = stores(tiny_graph, 50)
    ids = torch.randint(0, 600, (500,), generator=torch.Generator().manual_seed(1))
    want = plain.gather(ids)
    for how in ("random", "sequential", "normal"):
        cached.advise(how)
        assert cached.access == how and torch.equal(cached.gather(ids), want)


def test_with_features_in_ram_the_cache_is_ignored_in_one_line():
    p, decided = plan(W, "auto", 0, Budget(10**12, "t"), cache_rows=1000)
    assert p.feature_cache == "memory" and p.cache_rows == 0 and CACHE_PART not in p.parts
    assert decided[-1].startswith("hot-feature cache off (train.cache_gb, ")


# ---------------------------------------------------------------- a train run
def run(tmp_path, graph, name, *extra):
    cfg = compose(
        "train", f"graph_dir={graph}", f"run_dir={tmp_path / name}", "+exp=debug_tiny", "train.epochs=2",
        "train.feature_cache=mmap", "train.memory_budget=4GB", *extra,
    )  # fmt: skip
    summary = train.run(cfg)
    metrics = [json.loads(x) for x in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
    return summary, metrics


def test_a_cached_run_computes_exactly_what_an_uncached_one_does(tmp_path, tiny_graph):
    plain, m_plain = run(tmp_path, tiny_graph, "plain")
    # 600 nodes x 8 float32 features = 19,200 bytes: 0.000005 GB holds the top 156 nodes.
    cached, m_cached = run(tmp_path, tiny_graph, "cached", "train.cache_gb=0.000005")
    assert [{k: r[k] for k in COMPUTED if k in r} for r in m_plain] == [
        {k: r[k] for k in COMPUTED if k in r} for r in m_cached
    ]
    assert plain["test_acc"] == cached["test_acc"]
    for name in ("plain", "cached"):
        a = torch.load(tmp_path / "plain" / "checkpoints" / "last.pt", weights_only=True)["model"]
        b = torch.load(tmp_path / name / "checkpoints" / "last.pt", weights_only=True)["model"]
        assert all(torch.equal(a[k], b[k]) for k in a)
    assert "cache_hit_rate" not in m_plain[0] and "hot_feature_cache" not in plain
    c = cached["hot_feature_cache"]
    assert c["rows"] == 5000 // 32 and cached["memory_plan"]["cache_rows"] == c["rows"]
    for r in m_cached:
        assert r["cache_hits"] > 0 and r["cache_misses"] > 0
        assert r["cache_hit_rate"] == round(r["cache_hits"] / (r["cache_hits"] + r["cache_misses"]), 4)
    assert c["hits"] == sum(r["cache_hits"] for r in m_cached)
    # The hottest quarter of the nodes serves more than a quarter of the rows sampling reads.
    assert c["hit_rate"] > c["fraction_of_nodes"]


def test_with_features_in_ram_the_cache_is_off(tmp_path, tiny_graph, capsys):
    s, metrics = run(tmp_path, tiny_graph, "ram", "train.cache_gb=1", "train.feature_cache=memory")
    assert s["feature_cache"] == "memory" and "hot_feature_cache" not in s
    assert "cache_hit_rate" not in metrics[0]
    said = " ".join(capsys.readouterr().out.split())  # the console wraps long lines
    assert "hot-feature cache off (train.cache_gb, 1.00 GB): the features are held in RAM" in said


def test_a_negative_cache_size_is_refused(tmp_path, tiny_graph):
    from gnnscale.errors import ConfigError

    with pytest.raises(ConfigError, match=r"train.cache_gb=-1.0 must be >= 0"):
        run(tmp_path, tiny_graph, "bad", "train.cache_gb=-1")
