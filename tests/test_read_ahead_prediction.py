"""profile's capped seeds/s for features read by the sweep (profile/read_ahead.py): one pass priced from
the reader's own plan of the batches in flight at the disk's rates, shared by them, added to the compute
(on 2 cores the two do not overlap)."""

from __future__ import annotations

import dgl
import numpy as np
import pytest
import torch

from gnnscale.profile import read_ahead
from gnnscale.profile.read_ahead import HELD_PER_UNION, predict_read_ahead, read_seconds
from gnnscale.sampling.neighbor import NeighborBlockSampler
from gnnscale.storage.feature_reader import FeatureReader
from gnnscale.training.data import load_train_data

DISK = {
    "seq_mb_s": 100.0,
    "rand64k_mb_s_qd16": 6.5536,
    "rand4k_iops_qd1": 1,
    "rand4k_iops_qd16": 1,
    "direct": True,
    "cached": True,
    "small": False,
}  # fmt: skip  (64 KiB random: 100 requests/s)


def test_read_time_is_the_slower_of_bytes_and_requests():
    assert read_seconds({"bytes": 200_000_000, "requests": 10}, DISK) == (2.0, "disk bandwidth")
    assert read_seconds({"bytes": 1_000_000, "requests": 300}, DISK) == pytest.approx((3.0, "disk IOPS"))


@pytest.fixture
def tiny(tiny_graph, monkeypatch):
    monkeypatch.setattr(read_ahead, "probe_disk", lambda path: dict(DISK))
    return load_train_data(str(tiny_graph))


def _plan(rows: int, batches: int) -> dict:
    return {"feature_cache": "read", "stage_rows": rows, "stage_batches": batches}


@pytest.mark.parametrize("dense", [True, False], ids=["whole_chunks", "sparse_rows"])
def test_a_pass_of_the_sweep_is_priced_from_what_it_reads(tiny, monkeypatch, dense):
    """Dense unions: the whole feature file in 4 MiB requests; sparse ones: the reader's own plan."""
    monkeypatch.setattr(read_ahead, "reads_dense", lambda *a: dense)
    sampler, bs = NeighborBlockSampler([3, 3]), 16
    dgl.seed(0)
    p = predict_read_ahead(tiny, sampler, _plan(200, 8), bs, step_s=0.01)
    dgl.seed(0)  # the same neighbours drawn again
    drawn = read_ahead.union_growth(tiny.g, tiny.splits["train"], sampler, bs, tiny.g.num_nodes(), 8)
    k = p["batches_in_flight"]
    # as many in flight as the pool holds, a row once however many need it: HELD_PER_UNION of their union
    assert k == max(1, sum(1 for _, u in drawn if HELD_PER_UNION * u <= 200)) and 1 < k < 8
    union = torch.unique(torch.cat([torch.from_numpy(b) for b, _ in drawn[:k]]))
    with FeatureReader(tiny.graph) as reader:
        if dense:  # every shard's rows, one request each (the tiny graph's shards are under 4 MiB)
            nbytes = reader.num_nodes * reader.row_bytes
            plan = {"bytes": nbytes, "requests": len(tiny.graph.meta["shards"])}
        else:  # the same batches as the prediction drew, priced by the reader itself
            plan = reader.plan(union)
    assert p["pass_bytes"] == plan["bytes"] and p["pass_requests"] == plan["requests"]
    assert p["pass_rows"] == len(union)
    read = read_seconds(plan, DISK)[0]
    assert p["batch_s"] == pytest.approx(read / k + 0.01, abs=1e-4)  # reads and compute not overlapped
    assert p["seeds_per_s"] == pytest.approx(bs / p["batch_s"], rel=1e-3)
    more = predict_read_ahead(tiny, sampler, _plan(10_000, 8), bs, step_s=0.01)
    assert more["batches_in_flight"] == 8 and more["batch_s"] <= p["batch_s"]  # more rows held: faster


def test_a_slow_step_is_compute_bound(tiny):
    p = predict_read_ahead(tiny, NeighborBlockSampler([3, 3]), _plan(120, 8), 16, step_s=100.0)
    assert p["bound"] == "compute"
    assert p["seeds_per_s"] == pytest.approx(
        16 / (100.0 + p["pass_read_s"] / p["batches_in_flight"]), rel=1e-3
    )


def test_only_plans_that_read_ahead_are_predicted(tiny):
    sampler = NeighborBlockSampler([3, 3])
    assert predict_read_ahead(tiny, sampler, {"feature_cache": "memory"}, 16, 0.01) is None
    assert predict_read_ahead(tiny, sampler, {"feature_cache": "mmap", "stage_rows": 0}, 16, 0.01) is None


def test_first_layer_sums_are_priced_per_cohort(tiny):
    """Batches summed as the file is read: a pass reads the whole file and serves a cohort, half the
    batches sums_bytes holds on average (cohorts alternate); its adds are priced per first-layer edge."""
    from gnnscale.training import sum_sweep

    sampler, bs = NeighborBlockSampler([3, 3]), 16
    dgl.seed(0)
    ids = tiny.splits["train"]
    order = torch.from_numpy(np.random.default_rng(0).permutation(len(ids)))
    inp, _, blocks = sampler.sample_blocks(tiny.g, ids[order[:bs]])
    per = sum_sweep.shape_bytes(
        blocks[0].num_dst_nodes(), [b.num_edges() for b in blocks], [b.num_dst_nodes() for b in blocks],
        len(inp), tiny.features.stored_dim,
    )  # fmt: skip
    plans = {}
    for cohort in (1, 5):
        dgl.seed(0)  # the same neighbours drawn again
        plan = {"feature_cache": "read", "sums_bytes": cohort * 2 * per + per}
        plans[cohort] = predict_read_ahead(tiny, sampler, plan, bs, step_s=0.01)
        assert plans[cohort]["batches_in_flight"] == cohort + 0.5  # 2 x cohort + 1 held: k + 1, k, ...
    p = plans[5]
    with FeatureReader(tiny.graph) as reader:
        assert p["pass_bytes"] == reader.num_nodes * reader.row_bytes  # the whole file, every pass
    adds = blocks[0].num_edges() * read_ahead.ADD_S_PER_EDGE
    assert p["adds_s_per_batch"] == pytest.approx(adds, abs=1e-4)
    read = read_seconds({"bytes": p["pass_bytes"], "requests": p["pass_requests"]}, DISK)[0]
    want = max((read + 5.5 * adds) / 5.5, 0.01 + adds / torch.get_num_threads())
    assert p["batch_s"] == pytest.approx(want, abs=1e-4)
    assert plans[1]["batch_s"] > p["batch_s"]  # one batch a pass: the whole read is its own
