"""profile's capped seeds/s for features read a superbatch ahead (profile/read_ahead.py): the two ways
of staging priced from the reader's own plan of each superbatch at the disk's rates, the faster taken."""

from __future__ import annotations

import pytest
import torch

from gnnscale.profile import read_ahead
from gnnscale.profile.read_ahead import predict_read_ahead, read_seconds
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
    return {"feature_cache": "read", "stage_rows": rows, "stage_batches": batches, "stage_overlap": True}


def test_each_way_is_priced_from_the_readers_plan_of_its_superbatch(tiny):
    sampler, bs = NeighborBlockSampler([3, 3]), 16
    p = predict_read_ahead(tiny, sampler, _plan(120, 8), bs, step_s=0.01)
    halves, whole = p["modes"]["halves"], p["modes"]["whole"]
    assert 1 <= halves["batches"] <= whole["batches"] <= 8
    assert halves["union_rows"] <= 120 or halves["batches"] == 1
    assert whole["union_rows"] <= 240 or whole["batches"] == 1
    # the same batches as the prediction drew, priced by the reader itself
    drawn = read_ahead.union_growth(tiny.g, tiny.splits["train"], sampler, bs, 240, 8)
    union = torch.unique(torch.cat([torch.from_numpy(b) for b, _ in drawn[: whole["batches"]]]))
    with FeatureReader(tiny.graph) as reader:
        assert whole["read_bytes"] == reader.plan(union)["bytes"]
    for mode, m in p["modes"].items():
        read = read_seconds({"bytes": m["read_bytes"], "requests": m["requests"]}, DISK)[0]
        k = m["batches"]
        expect = max(read / k, 0.01) if mode == "halves" else read / k + 0.01
        assert m["batch_s"] == pytest.approx(expect, abs=1e-4)
    best = min(p["modes"].values(), key=lambda m: m["batch_s"])
    assert p["seeds_per_s"] == pytest.approx(bs / best["batch_s"], rel=1e-3)
    assert p["mode"] in ("halves", "whole") and p["modes"][p["mode"]] is best


def test_a_slow_step_is_compute_bound_and_hides_the_read_in_halves(tiny):
    p = predict_read_ahead(tiny, NeighborBlockSampler([3, 3]), _plan(120, 8), 16, step_s=100.0)
    assert p["mode"] == "halves" and p["bound"] == "compute"
    assert p["seeds_per_s"] == pytest.approx(16 / 100.0, rel=1e-3)


def test_only_plans_that_read_ahead_are_predicted(tiny):
    sampler = NeighborBlockSampler([3, 3])
    assert predict_read_ahead(tiny, sampler, {"feature_cache": "memory"}, 16, 0.01) is None
    assert predict_read_ahead(tiny, sampler, {"feature_cache": "mmap", "stage_rows": 0}, 16, 0.01) is None
