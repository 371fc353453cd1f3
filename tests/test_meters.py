"""Checks that must not pass without measuring: an unreadable memory meter reads None, never a passing 0;
a skipped benchmark check is not met; under CI's GNNSCALE_REQUIRE_SHARED_DATA absent data fails a test."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from gnnscale.stages.common import metered
from gnnscale.utils import memory

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def load_script(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}_under_test", SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def no_proc(monkeypatch) -> None:
    """/proc/self/status cannot be opened, as in a container without /proc or on another OS."""

    def refuse(path, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(memory, "open", refuse, raising=False)


def test_readings_are_real_numbers_where_proc_is_readable():
    # A fresh process: in this one, a train stage run earlier keeps freed heap pages resident
    # (utils/alloc.py), so a new allocation may not raise RssAnon at all.
    code = """
from gnnscale.utils import memory
base = memory.rss_anon_mb()
assert memory.rss_mb() > 1.0 and base > 1.0
with memory.MemorySampler(0.01) as mem:
    block = bytearray(b"x") * (64 * 2**20)  # 64 MiB of heap, every page written
assert mem.peak_anon_mb >= base + 60 and mem.peak_rss_mb >= mem.peak_anon_mb, (base, mem.peak_anon_mb)
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


def test_unreadable_proc_reads_none_not_zero(monkeypatch):
    no_proc(monkeypatch)
    assert memory.rss_anon_mb() is None and memory.rss_mb() is None
    with memory.MemorySampler(0.01) as mem:
        pass
    assert mem.peak_anon_mb is None and mem.peak_rss_mb is None
    with metered() as meter:
        pass
    stats = meter.stats()
    assert stats["peak_rss_mb"] is None and stats["peak_anon_mb"] is None
    assert stats["wall_time_s"] >= 0 and stats["max_rss_mb"] > 0  # getrusage needs no /proc
    with pytest.raises(RuntimeError, match="peak RssAnon could not be read"):
        memory.measured_mb(mem.peak_anon_mb, "peak RssAnon")


def test_a_field_the_kernel_lacks_reads_none(monkeypatch, tmp_path):
    status = tmp_path / "status"
    status.write_text("Name:\tpython\nVmRSS:\t  2048 kB\n")  # no RssAnon line (kernels before 4.5)
    real_open = open
    monkeypatch.setattr(memory, "open", lambda path, *a, **k: real_open(status, *a, **k), raising=False)
    assert memory.rss_mb() == 2.0 and memory.rss_anon_mb() is None


def test_one_failed_sample_makes_the_peak_unknown(monkeypatch):
    """A peak over only the samples that could be read may be below the real one: it is None, not a number."""
    mem = memory.MemorySampler(0.01)
    mem._sample()
    assert mem.peak_anon_mb > 0
    no_proc(monkeypatch)
    mem._sample()
    monkeypatch.undo()
    mem._sample()
    assert mem.peak_anon_mb is None and mem.peak_rss_mb is None


def test_storage_benchmark_stops_when_memory_cannot_be_read(monkeypatch, tmp_path):
    bench = load_script("bench_storage")
    no_proc(monkeypatch)
    argv = ["bench_storage.py", "--num-nodes", "1000", "--scratch", str(tmp_path / "s")]
    argv += ["--out", str(tmp_path / "out.json")]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(RuntimeError, match="RssAnon could not be read"):
        bench.main()
    assert not (tmp_path / "out.json").exists()  # no result file that could be read as a pass


def test_skipped_accuracy_check_is_not_met():
    all_met = load_script("bench_accuracy").all_met
    ran = {"target": 0.8, "met": True}
    assert all_met({"cora": ran, "citeseer": dict(ran)})
    assert not all_met({"cora": ran, "tolokers": {"skipped": "data.path=... is absent", "met": False}})
    assert not all_met({"cora": ran, "tolokers": {"skipped": "data.path=... is absent"}})  # older records
    assert not all_met({"cora": ran, "citeseer": {"target": 0.68, "met": False}})
    assert not all_met({})  # nothing ran (e.g. --only with no known check): nothing was shown to be met


def test_absent_shared_data_skips_locally_and_fails_in_ci(monkeypatch, tmp_path):
    from tests import conftest

    monkeypatch.setattr(conftest, "SHARED_DATA", tmp_path)
    (tmp_path / "here").mkdir()
    assert conftest.shared_data("here") == tmp_path / "here"
    monkeypatch.delenv("GNNSCALE_REQUIRE_SHARED_DATA", raising=False)
    with pytest.raises(pytest.skip.Exception, match="is absent"):
        conftest.shared_data("planetoid_cora")
    monkeypatch.setenv("GNNSCALE_REQUIRE_SHARED_DATA", "1")
    with pytest.raises(pytest.fail.Exception, match="GNNSCALE_REQUIRE_SHARED_DATA is set"):
        conftest.shared_data("planetoid_cora")


def test_ci_requires_shared_data_and_runs_make_test():
    script = (SCRIPTS.parent / ".ci" / "run").read_text()
    lines = [line.strip() for line in script.splitlines() if line.strip() and not line.startswith("#")]
    assert "export GNNSCALE_REQUIRE_SHARED_DATA=1" in lines and lines[-1] == "make test"
    assert lines.index("export GNNSCALE_REQUIRE_SHARED_DATA=1") < lines.index("make test")
