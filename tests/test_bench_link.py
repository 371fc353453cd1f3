"""scripts/bench_link.py: the speed comparison (gnnscale vs a plain DGL edge-prediction loop) runs end to end
on a tiny graph, and its result is merged into the results file without dropping other graphs' entries."""

from __future__ import annotations

import json
import sys

import pytest

from scripts import bench_link  # importable by name: the spawned children unpickle its functions


def test_lockstep_times_only_the_batches_after_the_warmup(monkeypatch):
    # (wall, cpu) clock readings: start, then after each batch end (the reading taken once the turn is back)
    ticks = iter([(0, 0), (1, 0), (1, 0), (3, 1), (3, 1), (4, 1), (4, 1), (6, 2), (6, 2), (9, 2), (9, 2)])
    monkeypatch.setattr(bench_link.Lockstep, "_now", staticmethod(lambda: next(ticks)))
    clock = bench_link.Lockstep(warmup=1, batches=4, chunk=3)
    for _ in range(5):
        clock.batch_end()
    got = clock.result()  # timed batches took 2, 1, 2, 3 s: chunks of 3 and 1 batches
    assert got["timed_batches"] == 4 and got["batches_run"] == 5
    assert got["per_batch_s"] == 2.0 and got["per_batch_cpu_s"] == 0.5 and got["per_batch_min_s"] == 1
    assert got["chunk_s"] == [5, 3]


def test_unknown_graph_is_refused(monkeypatch, tmp_path):
    out = tmp_path / "link.json"
    monkeypatch.setattr(sys, "argv", ["bench_link.py", "--only", "nope", "--out", str(out)])
    with pytest.raises(SystemExit, match="unknown graph"):
        bench_link.main()
    assert not out.exists()


def test_speed_comparison_runs_and_merges(monkeypatch, tmp_path):
    out = tmp_path / "link.json"
    kept = {"mean": {"sage_link": {"auc": 0.93}}, "met": True}
    out.write_text(json.dumps({"graphs": {"cora": kept}, "notes": "kept too"}))
    argv = ["bench_link.py", "--only", "synthetic500k", "--speed-nodes", "2000", "--speed-scratch"]
    argv += [str(tmp_path / "s"), "--out", str(out), "--warmup", "1", "--batches", "2"]
    argv += ["--eval-batches", "1", "--threads", "1", "--chunk", "1", "--repeats", "1"]
    monkeypatch.setattr(sys, "argv", argv)
    bench_link.main()
    res = json.loads(out.read_text())
    assert res["graphs"]["cora"] == kept and res["notes"] == "kept too"
    speed = res["graphs"]["synthetic500k"]
    assert speed["graph"]["num_nodes"] == 2000
    for side in ("plain_dgl", "gnnscale"):
        run = speed["rounds"][0][side]
        assert run["batches_run"] == 3 and run["timed_batches"] == 2 and run["threads"] == 1
        assert run["per_batch_s"] > 0 and 0 <= run["test"]["hits@50"] <= 1
        assert len(run["chunk_s"]) == 2  # --chunk 1: two turns each
    assert speed["ratio_gnnscale_over_plain"] > 0 and len(speed["rounds"][0]["chunk_ratios"]) == 2
    assert res["last_run"]["graphs"] == ["synthetic500k"]
