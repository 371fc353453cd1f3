"""train lives within its memory: the limit reader, the plan and its decisions, refusal before any batch,
plain progress lines off a terminal, and a real cgroup limit."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from dataclasses import replace
from pathlib import Path

import pytest

from gnnscale.errors import ConfigError
from gnnscale.stages import train
from gnnscale.training.memory_plan import (
    BatchShape,
    Sizes,
    Workload,
    _step_bytes,
    cohort_batches,
    estimate,
    fitting_settings,
    plan,
    refusal,
    sums_batch_bytes,
)
from gnnscale.utils.memlimit import Budget, gb, memory_limit, parse_size, resolve_budget
from tests.conftest import TINY_SYNTHETIC, build_graph, compose

CLI = [sys.executable, "-c", "from gnnscale.cli import main; main()"]


# ---------------------------------------------------------------- the limit reader, on fake files
def fake_machine(tmp_path: Path, cgroup_line: str, files: dict, avail_kb: int | None = 8_000_000):
    proc, cg = tmp_path / "proc", tmp_path / "cgroup"
    (proc / "self").mkdir(parents=True)
    (proc / "self" / "cgroup").write_text(cgroup_line + "\n")
    (proc / "self" / "status").write_text("Name:\tpython\nVmRSS:\t  100000 kB\nRssAnon:\t 90000 kB\n")
    if avail_kb is not None:
        (proc / "meminfo").write_text(f"MemTotal:       16000000 kB\nMemAvailable:   {avail_kb} kB\n")
    for rel, text in files.items():
        (cg / rel).parent.mkdir(parents=True, exist_ok=True)
        (cg / rel).write_text(text + "\n")
    return proc, cg


def test_cgroup_v2_limit_is_the_smallest_up_the_path(tmp_path):
    proc, cg = fake_machine(
        tmp_path, "0::/a/b", {"a/b/memory.max": "1073741824", "a/memory.max": "max", "memory.max": "max"}
    )
    limit = memory_limit(proc, cg)
    assert (limit.bytes, limit.source) == (1073741824, "cgroup v2 memory.max")
    (cg / "a" / "memory.max").write_text("500000000\n")  # a parent's tighter limit binds the child
    assert memory_limit(proc, cg).bytes == 500_000_000


def test_cgroup_v2_beside_v1_is_read_under_unified(tmp_path):
    proc, cg = fake_machine(tmp_path, "0::/job", {"unified/job/memory.max": "2000000000"})
    assert memory_limit(proc, cg).bytes == 2_000_000_000


def test_cgroup_v1_limit_and_its_no_limit_value(tmp_path):
    proc, cg = fake_machine(
        tmp_path,
        "4:memory:/docker/x\n3:cpu,cpuacct:/docker/x",
        {"memory/docker/x/memory.limit_in_bytes": "1500000000"},
    )
    limit = memory_limit(proc, cg)
    assert (limit.bytes, limit.source) == (1_500_000_000, "cgroup v1 memory.limit_in_bytes")
    # v1's "unlimited" is a huge number: then the machine's free memory (+ this process's RSS) decides.
    (cg / "memory/docker/x/memory.limit_in_bytes").write_text("9223372036854771712\n")
    limit = memory_limit(proc, cg)
    assert (limit.bytes, limit.source) == ((8_000_000 + 100_000) * 1024, "MemAvailable")


def test_memavailable_is_used_when_it_is_tighter_than_the_cgroup(tmp_path):
    proc, cg = fake_machine(tmp_path, "0::/a", {"a/memory.max": "64000000000"}, avail_kb=1_000_000)
    assert memory_limit(proc, cg) == memory_limit(proc, tmp_path / "no-cgroup-here")
    assert memory_limit(proc, cg).source == "MemAvailable"


def test_unreadable_limit_is_none_and_auto_then_asks_for_a_size(tmp_path, monkeypatch):
    proc, cg = fake_machine(tmp_path, "0::/", {}, avail_kb=None)
    assert memory_limit(proc, cg) is None
    assert memory_limit(tmp_path / "nothing", tmp_path / "nothing") is None
    monkeypatch.setattr("gnnscale.utils.memlimit.memory_limit", lambda: None)
    with pytest.raises(ConfigError) as e:
        resolve_budget("auto", "train.memory_budget")
    assert e.value.one_line() == (
        "cannot read this machine's memory limit (no cgroup limit, no /proc/meminfo); "
        "set train.memory_budget=SIZE, e.g. train.memory_budget=8GB"
    )


def test_budget_auto_and_sizes():
    from gnnscale.utils.memlimit import MemoryLimit

    b = resolve_budget("auto", "k", MemoryLimit(2_000_000_000, "cgroup v1 memory.limit_in_bytes"))
    assert b.bytes == 1_800_000_000 and "cgroup v1" in b.why
    assert parse_size("6GB", "k") == 6_000_000_000
    assert parse_size("1.5g", "k") == 1_500_000_000
    assert parse_size("800MiB", "k") == 800 * 2**20
    assert resolve_budget("512MB", "train.memory_budget").why == "train.memory_budget=512MB"
    for bad in ("lots", "0", "-1GB", "6 parsecs"):
        with pytest.raises(ConfigError, match="is not a memory size"):
            parse_size(bad, "train.memory_budget")


# ---------------------------------------------------------------- the plan and its decisions
SIZES = Sizes(
    num_nodes=1_000_000, feat_dim=256, feat_itemsize=4, csc_bytes=80_000_000, dims=(256, 128, 8),
    num_params=70_000, input_dropout=False,
)  # fmt: skip
TRAIN = BatchShape(input_rows=200_000, dst_rows=(20_000, 1024), edges=(200_000, 10_000))
EVAL = BatchShape(input_rows=400_000, dst_rows=(60_000, 4096), edges=(600_000, 40_000))
W = Workload.now(SIZES, TRAIN, EVAL)


def between(lo: int, hi: int) -> Budget:
    assert hi - lo > 20e6  # far from both ends
    return Budget((lo + hi) // 2, "test")


def test_features_stay_in_ram_only_when_they_fit():
    big = Budget(10**12, "test")
    in_ram = estimate(W, "memory", 0, big)
    mapped = estimate(W, "mmap", 0, big)
    # The whole matrix in RAM against the pages of it one training batch reads through the mmap.
    hot = mapped.parts["feature pages one batch reads (mmap)"]
    assert hot == int(1_000_000 * 256 * 4 * (1 - (1 - 200_000 / 1_000_000) ** 4))
    assert in_ram.must_fit - mapped.must_fit == 1_000_000 * 256 * 4 - hot
    p, decided = plan(W, "auto", 0, big)
    assert p.feature_cache == "memory" and decided == ["features in RAM: they fit the memory budget"]
    read = estimate(W, "read", 0, big, structure="memory")
    p, decided = plan(W, "auto", 0, between(read.must_fit, in_ram.must_fit))
    assert p.feature_cache == "read" and p.fits and p.structure == "memory"
    assert decided == [
        "features read from disk ahead of the model: held in RAM they would not fit the memory budget"
    ]


def test_prefetch_shrinks_to_fit_and_a_plan_that_cannot_fit_says_what_would():
    deep = estimate(W, "mmap", 2, Budget(10**12, "test"))
    inline = estimate(W, "mmap", 0, Budget(10**12, "test"))
    p, decided = plan(W, "mmap", 2, between(inline.must_fit, deep.must_fit))
    assert p.prefetch < 2 and p.fits and decided[-1].startswith("prefetch 2 -> ")
    lean = estimate(W, "read", 0, Budget(10**12, "test"))
    tight = Budget(lean.must_fit - 150_000_000, "test")
    p, _ = plan(W, "auto", 0, tight)
    assert not p.fits
    fix = fitting_settings(W, 1024, 4096, tight)
    m = re.fullmatch(r"(?:train.batch_size=(\d+) )?train.eval_batch_size=(\d+) \(estimate .*\)", fix)
    bs, ebs = int(m.group(1) or 1024), int(m.group(2))
    assert ebs < 4096 and bs <= 1024  # evaluation batches (the largest) come down first
    assert estimate(W.scaled(bs / 1024, ebs / 4096), "read", 0, tight).fits


def test_first_layer_sums_plan_holds_cohorts_not_rows():
    """A first layer summed as the file is read (Sizes.first_sums): the plan holds no gathered rows and no
    row pool, only the pass's buffers and the cohorts' sums, which grow into what the budget leaves."""
    sums_sizes = replace(SIZES, dims=(256, 256, 8), first_sums=True)
    rows_sizes = replace(sums_sizes, first_sums=False)
    w_sums, w_rows = (Workload(s, TRAIN, TRAIN, 300 << 20, 0) for s in (sums_sizes, rows_sizes))
    lean_sums = estimate(w_sums, "read", 0, Budget(10**12, "t"), structure="memory")
    lean_rows = estimate(w_rows, "read", 0, Budget(10**12, "t"), structure="memory")
    assert lean_sums.parts["gather buffers"] == 0 and "rows read ahead" not in lean_sums.parts
    least = 2 * sums_batch_bytes(sums_sizes, TRAIN)  # a cohort of one batch, twice
    assert lean_sums.sums_bytes == lean_sums.parts["first-layer sums (two cohorts)"] == least
    assert lean_sums.must_fit < lean_rows.must_fit
    budget = between(lean_sums.must_fit, lean_rows.must_fit)
    p, said = plan(w_rows, "auto", 0, budget)
    assert not p.fits  # the row sweep's plan does not fit this budget
    p, said = plan(w_sums, "auto", 0, budget)
    assert p.fits and p.feature_cache == "read" and p.sums_bytes > least and p.must_fit <= budget.bytes
    assert budget.bytes - p.must_fit < 0.11 * (budget.bytes - lean_sums.must_fit)  # STAGE_SHARE of the room
    assert cohort_batches(w_sums, p) == p.sums_bytes // sums_batch_bytes(sums_sizes, TRAIN) / 2  # alternating
    assert "first-layer sums of a cohort of batches" in p.line() and p.as_dict()["sums_bytes"] == p.sums_bytes


def test_sage_step_counts_the_source_projection():
    """SAGEConv (mean) and GraphConv project every source row when d_in > d_out: the estimate holds it."""
    narrow = Sizes(**{**SIZES.__dict__, "dims": (128, 256, 8)})  # d_in < d_out on layer 0: no source term
    one = BatchShape(input_rows=1000, dst_rows=(100, 10), edges=(0, 0))
    more = BatchShape(input_rows=2000, dst_rows=(100, 10), edges=(0, 0))
    assert _step_bytes(SIZES, more, False) - _step_bytes(SIZES, one, False) == 1000 * 128 * 4
    assert _step_bytes(narrow, more, False) == _step_bytes(narrow, one, False)


# ---------------------------------------------------------------- end to end
@pytest.mark.parametrize("feat_dim", [64, 512])
def test_estimate_is_within_30_percent_of_the_measured_peak(tmp_path, feat_dim):
    graph = build_graph(tmp_path, "data.num_nodes=20000", "data.avg_degree=10", f"data.feat_dim={feat_dim}")
    s = train.run(
        compose(
            "train", f"graph_dir={graph}", f"run_dir={tmp_path / 'run'}", "+exp=sage_2hop", "train.epochs=1"
        )
    )
    estimate_mb, measured_mb = s["memory_plan"]["rss_estimate_mb"], s["peak_rss_mb"]
    assert 0.7 <= estimate_mb / measured_mb <= 1.3, (estimate_mb, measured_mb, s["memory_plan"])  # fmt: skip


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_graph(tmp_path_factory.mktemp("tiny"), *TINY_SYNTHETIC)


def test_a_budget_too_small_exits_2_before_any_batch(tmp_path, tiny):
    run_dir = tmp_path / "run"
    r = subprocess.run(
        [*CLI, "train", f"graph_dir={tiny}", f"run_dir={run_dir}", "train.memory_budget=50MB"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: train needs about ")
    assert "memory budget is 0.05 GB (train.memory_budget=50MB)" in lines[0]
    assert not run_dir.exists()  # refused before the run began: no run_dir, no batch, no checkpoint


def test_refusals_name_the_settings_that_would_fit():
    big = Budget(10**12, "test")
    in_ram = estimate(W, "memory", 0, big)
    read = estimate(W, "read", 0, big)
    # feature_cache=memory forced where features read from disk would fit: point at auto.
    assert in_ram.must_fit > read.must_fit + 20_000_000
    p, _ = plan(W, "memory", 0, Budget(read.must_fit + 10_000_000, "test"))
    what, fix = refusal(W, p, 1024, 4096)
    assert not p.fits and what.startswith("train needs about") and "features in RAM" in what
    assert fix == f"use train.feature_cache=auto (features read from disk fit: {gb(read.must_fit)})"
    # Nothing fits as configured: a batch size that does.
    p, _ = plan(W, "auto", 0, Budget(read.must_fit - 150_000_000, "test"))
    _, fix = refusal(W, p, 1024, 4096)
    assert fix.startswith("it would fit with train.") and "train.memory_budget=SIZE" in fix


def test_a_refusal_warns_where_the_batch_size_it_names_leaves_one_batch_per_pass():
    """Naming a batch size that fits only with no room for a second batch's rows would send the user to a
    run where every batch reads about the whole feature file alone (0.066x uncapped on the 1M-node bench):
    the refusal says so, and does not where the rows read ahead hold more batches."""
    big = Budget(10**12, "test")
    half = W.scaled(0.5, 512 / 4096)
    at_half = estimate(half, "read", 0, big).must_fit
    p, _ = plan(W, "auto", 0, Budget(at_half + 1_000_000, "test"))
    _, fix = refusal(W, p, 1024, 4096)
    assert fix.startswith("it would fit with train.batch_size=512 ") and "though slowly" in fix
    roomy = Budget(estimate(W, "read", 0, big).must_fit - 1_000_000, "test")
    p, _ = plan(W, "auto", 0, roomy)
    _, fix = refusal(W, p, 1024, 4096)
    assert fix.startswith("it would fit with train.eval_batch_size=1024 ") and "slowly" not in fix
    named = W.scaled(1.0, 1024 / 4096)
    staged, _ = plan(named, "read", 0, roomy)
    assert staged.sweep_cap >= named.train.input_rows  # the rows of more than one batch read ahead


def test_off_a_terminal_progress_is_one_plain_line_per_interval(tmp_path):
    """stdout is a pipe here: shard, train and infer each print `what: done/total · rate · ETA` lines."""
    r = subprocess.run(
        [*CLI, "pipeline", f"graph_dir={tmp_path / 'g'}", f"run_dir={tmp_path / 'p'}", *TINY_SYNTHETIC,
         "+exp=debug_tiny", "train.epochs=2", "ui.log_every_s=0", "infer.batch_size=128"],
        capture_output=True, text=True, timeout=600, env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    out = r.stdout.splitlines()
    clock = r"\d+:\d\d"
    train_line = re.compile(
        rf"^epoch 2/2: (\d+)/(\d+) · [\d,.]+/s · ETA {clock} · elapsed {clock} · loss [\d.]+ · [\d,]+ seeds/s$"
    )
    hits = [m for m in map(train_line.match, out) if m]
    assert hits and all(int(m.group(1)) <= int(m.group(2)) for m in hits)
    assert int(hits[-1].group(1)) == int(hits[-1].group(2))  # the last batch is reported too
    assert any(re.match(rf"^nodes: [\d,]+/600 · [\d,.]+/s · ETA {clock}", line) for line in out)
    assert any(re.match(rf"^layer 1/2: [\d,]+/600 · [\d,.]+/s · ETA {clock}", line) for line in out)
    assert "━" not in r.stdout + r.stderr  # no rich bar drawn into a log


# ---------------------------------------------------------------- a real memory limit
def _cgroup_v1(limit: int) -> Path | None:
    root = Path("/sys/fs/cgroup/memory")
    if os.geteuid() != 0 or not (root / "cgroup.procs").is_file():
        return None
    cg = root / f"gnnscale-test-{uuid.uuid4().hex[:8]}"
    try:
        cg.mkdir()
        (cg / "memory.limit_in_bytes").write_text(str(limit))
    except OSError:
        return None
    return cg


def test_under_a_real_1_2_gb_limit_train_completes_or_refuses_never_killed(tmp_path):
    limit = 1_200_000_000
    cg = _cgroup_v1(limit)
    if cg is None:
        pytest.skip(
            "cannot create a cgroup v1 memory group here (needs root and a writable /sys/fs/cgroup/memory)"
        )
    try:
        graph = build_graph(tmp_path, "data.num_nodes=200000", "data.avg_degree=10", "data.feat_dim=512")
        # Out of the page cache: the pages train reads are then charged to its cgroup, beside its heap
        # (CI was killed this way while a warm cache, charged to the parent, let the same run pass).
        for f in graph.rglob("*"):
            if f.is_file():
                fd = os.open(f, os.O_RDONLY)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                os.close(fd)
        r = subprocess.run(
            [*CLI, "train", f"graph_dir={graph}", f"run_dir={tmp_path / 'run'}", "+exp=sage_2hop", "train.epochs=1"],
            capture_output=True, text=True, timeout=900,
            preexec_fn=lambda: (cg / "cgroup.procs").write_text(str(os.getpid())),
        )  # fmt: skip
        assert r.returncode in (0, 2), (r.returncode, r.stderr[-2000:])  # 137 / -9 would be the kernel's kill
        if r.returncode == 2:
            assert (
                r.stderr.startswith("error: train needs about ") and len(r.stderr.strip().splitlines()) == 1
            )
        else:
            s = json.loads((tmp_path / "run" / "summary.json").read_text())
            m = s["memory_plan"]
            assert "cgroup v1" in m["budget"] and m["budget_mb"] * 2**20 < limit
            # The plan's heap estimate covers the heap measured (sampled) over the whole run.
            heap = m["must_fit_mb"] - sum(v for k, v in m["parts_mb"].items() if "(mmap)" in k)
            assert 0 < s["peak_anon_mb"] <= heap, (s["peak_anon_mb"], m)
    finally:
        for _ in range(50):
            try:
                cg.rmdir()
                break
            except OSError:
                import time

                time.sleep(0.1)
