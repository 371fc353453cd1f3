"""probe_disk: positive rates from the graph's own files, kept in graph_dir/disk_probe.json and reused
without any I/O until refresh, another device or other files; a read-only graph_dir keeps it in memory."""

from __future__ import annotations

import json

import gnnscale.storage.disk_probe as dp
from gnnscale.storage.disk_probe import PROBE_FILE, probe_disk

RATES = (
    "seq_mb_s",
    "sweep_mb_s_qd16",
    "rand4k_iops_qd1",
    "rand4k_iops_qd16",
    "rand4k_mb_s_qd16",
    "rand64k_mb_s_qd16",
)
QUICK = 0.05  # seconds per test: the numbers are noise, the tests check plumbing


def refuse_io(monkeypatch) -> None:
    """Make any measurement fail from here on: a call that returns proves it read nothing."""

    def refuse(files, seconds):
        raise AssertionError("probe_disk measured again")

    monkeypatch.setattr(dp, "measure", refuse)


def test_probe_measures_and_keeps_the_result(tiny_graph):
    files_before = sorted(p.name for p in tiny_graph.iterdir())
    result = probe_disk(tiny_graph, seconds=QUICK)
    assert result["cached"] is False and result["saved"] == "file"
    assert all(result[k] > 0 for k in RATES), result
    assert result["small"] is True  # 600 nodes: far below the size that gives steady numbers
    assert result["bytes_probed"] == sum((tiny_graph / s).stat().st_size for s in _shards(tiny_graph))
    assert sorted(p.name for p in tiny_graph.iterdir()) == sorted(files_before + [PROBE_FILE])
    kept = json.loads((tiny_graph / PROBE_FILE).read_text())
    assert kept["st_dev"] == (tiny_graph / _shards(tiny_graph)[0]).stat().st_dev
    assert {k: kept[k] for k in RATES} == {k: result[k] for k in RATES}


def test_second_call_reuses_without_io(tiny_graph, monkeypatch):
    first = probe_disk(tiny_graph, seconds=QUICK)
    refuse_io(monkeypatch)
    again = probe_disk(tiny_graph, seconds=QUICK)
    assert again["cached"] is True and {k: again[k] for k in RATES} == {k: first[k] for k in RATES}


def test_refresh_and_a_changed_device_measure_again(tiny_graph, monkeypatch):
    first = probe_disk(tiny_graph, seconds=QUICK)
    calls = []
    real = dp.measure

    def counted(files, seconds):
        calls.append(seconds)
        return real(files, seconds)

    monkeypatch.setattr(dp, "measure", counted)
    again = probe_disk(tiny_graph, seconds=QUICK, refresh=True)
    assert again["cached"] is False and len(calls) == 1 and again["time"] >= first["time"]
    kept = json.loads((tiny_graph / PROBE_FILE).read_text())
    kept["st_dev"] += 1  # as if the graph_dir had moved to another disk
    (tiny_graph / PROBE_FILE).write_text(json.dumps(kept))
    assert probe_disk(tiny_graph, seconds=QUICK)["cached"] is False and len(calls) == 2
    assert probe_disk(tiny_graph, seconds=QUICK)["cached"] is True and len(calls) == 2


def test_read_only_graph_dir_keeps_the_result_in_memory(tiny_graph, monkeypatch):
    def read_only(path, obj):
        raise PermissionError(30, "Read-only file system", str(path))

    monkeypatch.setattr(dp, "write_json", read_only)
    monkeypatch.setattr(dp, "_in_memory", {})
    first = probe_disk(tiny_graph, seconds=QUICK)
    assert first["saved"] == "memory" and not (tiny_graph / PROBE_FILE).exists()
    refuse_io(monkeypatch)
    assert probe_disk(tiny_graph, seconds=QUICK)["cached"] is True


def test_buffered_fallback_says_so(tiny_graph, monkeypatch):
    monkeypatch.setattr(dp, "direct_works", lambda path: False)
    result = probe_disk(tiny_graph, seconds=QUICK, refresh=True)
    assert result["direct"] is False and "O_DIRECT refused" in result["note"]
    assert all(result[k] > 0 for k in RATES)


def _shards(graph_dir) -> list[str]:
    return [s["file"] for s in json.loads((graph_dir / "meta.json").read_text())["shards"]]
