"""Faults other than bad input: a second process on one folder, a diverging run, Ctrl-C, a read-only
graph_dir, SIGKILL mid-stage. Each leaves the folders absent, as they were, or resumable (never a
valid-looking partial result), says what to do in one line, and the rerun equals an uninterrupted run.

Kill points are deterministic: GNNSCALE_FAULT="<point>[#n]:<action>" (gnnscale/utils/faults.py) makes the
n-th pass through a named point in the child process SIGKILL / SIGINT itself, or wait to be killed.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from gnnscale.cli import app
from gnnscale.storage.lock import graph_lock_path
from gnnscale.storage.shard_writer import staging_dir_for
from gnnscale.storage.verify import check_files
from gnnscale.utils import faults
from tests.conftest import TINY_SYNTHETIC, build_graph, fake_infer_run

runner = CliRunner()
EPOCHS = 3
# debug_tiny: batches of 64 over ~360 training nodes, 6 batches an epoch: batch 9 is mid-epoch 2.
TRAIN = ("+exp=debug_tiny", f"train.epochs={EPOCHS}", "train.diagnostics=false", "train.eval_every=1")
MID_EPOCH_2 = "train.batch#9"
ROOT = Path(__file__).resolve().parents[1]


def gnnscale(*args: str, fault: str | None = None, cwd: Path | None = None, wait: bool = True, **env):
    """`python -m gnnscale ARGS` in a child process (GNNSCALE_FAULT=fault); its CompletedProcess, or the
    Popen when wait=False."""
    environ = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    environ.pop("GNNSCALE_FAULT", None)
    if fault:
        environ["GNNSCALE_FAULT"] = fault
    cmd = [sys.executable, "-m", "gnnscale", *args]
    kw = dict(cwd=cwd, env=environ, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if not wait:
        return subprocess.Popen(cmd, **kw)
    return subprocess.run(cmd, timeout=300, **kw)


def wait_for(path: Path, proc: subprocess.Popen, timeout: float = 120) -> None:
    t0 = time.time()
    while not path.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.time() - t0 < timeout, "the child never reached its fault point"
        time.sleep(0.1)


def metrics(run_dir: Path) -> list[dict]:
    """metrics.jsonl without the timings (wall-clock numbers differ between any two runs)."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    drop = ("seeds_per_s", "peak_rss_mb")
    return [{k: v for k, v in r.items() if not k.endswith("_s") and k not in drop} for r in rows]


def weights(run_dir: Path) -> dict:
    return torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)["model"]


def says(output: str, phrase: str) -> bool:
    """Whether console output holds `phrase`, whitespace aside: rich wraps at the terminal width, mid-word
    or at a space that it then drops, so where a path's length puts the wraps decides the spacing."""
    return "".join(phrase.split()) in "".join(output.split())


def one_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    assert len(lines) == 1, text
    return lines[0]


@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    return build_graph(tmp_path_factory.mktemp("faults"), *TINY_SYNTHETIC)


@pytest.fixture(scope="module")
def uninterrupted(graph, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("full") / "run"
    result = runner.invoke(app, ["train", f"graph_dir={graph}", f"run_dir={run_dir}", *TRAIN])
    assert result.exit_code == 0, result.output
    return run_dir


@pytest.fixture(autouse=True)
def _no_fault_counts(monkeypatch):
    monkeypatch.setattr(faults, "_counts", {})


def assert_same_run(run_dir: Path, reference: Path) -> None:
    assert metrics(run_dir) == metrics(reference)
    assert [r["epoch"] for r in metrics(run_dir)] == list(range(1, EPOCHS + 1))
    ours, theirs = weights(run_dir), weights(reference)
    for key, value in theirs.items():
        torch.testing.assert_close(ours[key], value, rtol=1e-5, atol=1e-6, msg=key)


# ---------------------------------------------------------------- two processes on one folder
def test_a_second_train_on_a_run_dir_is_refused_and_a_dead_owners_lock_taken_over(tmp_path, graph):
    run_dir, mark = tmp_path / "run", tmp_path / "at_fault_point"
    first = gnnscale(
        "train", f"graph_dir={graph}", f"run_dir={run_dir}", *TRAIN,
        fault="train.batch#2:wait", wait=False, GNNSCALE_FAULT_MARK=str(mark),
    )  # fmt: skip
    try:
        wait_for(mark, first)
        second = gnnscale("train", f"graph_dir={graph}", f"run_dir={run_dir}", *TRAIN, "overwrite=true")
        assert second.returncode == 2
        line = one_line(second.stderr)
        assert f"run_dir '{run_dir}' is in use by pid {first.pid} (gnnscale train)" in line and "wait" in line
    finally:
        first.kill()
        first.wait()
    # The owner was killed: its lock file stays, naming a dead pid; the next run takes it over and says so.
    third = runner.invoke(
        app, ["train", f"graph_dir={graph}", f"run_dir={run_dir}", *TRAIN, "overwrite=true"]
    )
    assert third.exit_code == 0, third.output
    assert says(third.stdout, f"taking over the lock of run_dir '{run_dir}' left by pid {first.pid}")
    assert not (tmp_path / ".run.lock").exists()  # released cleanly: nothing left to take over


def test_a_graph_dir_being_written_refuses_a_second_writer_and_readers(tmp_path, graph):
    g = shutil.copytree(graph, tmp_path / "g")
    mark = tmp_path / "at_fault_point"
    writer = gnnscale(
        "build-csr", f"graph_dir={g}", f"run_dir={tmp_path / 'r1'}",
        fault="csc.shard#1:wait", wait=False, GNNSCALE_FAULT_MARK=str(mark),
    )  # fmt: skip
    try:
        wait_for(mark, writer)
        second = runner.invoke(app, ["build-csr", f"graph_dir={g}", f"run_dir={tmp_path / 'r2'}"])
        assert second.exit_code == 2
        assert f"graph_dir '{g}' is in use by pid {writer.pid} (gnnscale build-csr)" in one_line(
            second.stderr
        )
        reader = runner.invoke(app, ["train", f"graph_dir={g}", f"run_dir={tmp_path / 't'}", *TRAIN])
        assert reader.exit_code == 2
        assert f"is being written by pid {writer.pid}" in one_line(reader.stderr)
        shard = runner.invoke(app, ["shard", f"graph_dir={g}", "overwrite=true", *TINY_SYNTHETIC])
        assert shard.exit_code == 2 and "is in use by pid" in shard.stderr
    finally:
        writer.kill()
        writer.wait()
    assert graph_lock_path(g).exists()  # the dead writer's; readers are not held back by it
    assert runner.invoke(app, ["verify", f"graph_dir={g}"]).exit_code == 0


# ---------------------------------------------------------------- divergence
def test_a_diverging_run_stops_with_what_to_try(tmp_path, graph):
    result = runner.invoke(
        app,
        [
            "train",
            f"graph_dir={graph}",
            f"run_dir={tmp_path / 'run'}",
            *TRAIN,
            "train.lr=1e30",
            "train.grad_clip=0",
        ],
    )
    assert result.exit_code == 2
    line = one_line(result.stderr)
    assert "training diverged in epoch 1" in line and "no checkpoint was saved" in line
    assert "lower train.lr" in line and "train.grad_clip" in line


def test_divergence_keeps_the_best_checkpoint_usable(tmp_path, graph, monkeypatch):
    monkeypatch.setenv("GNNSCALE_FAULT", "train.epoch#3:nan")  # the loss of epoch 3 turns non-finite
    run_dir = tmp_path / "run"
    result = runner.invoke(
        app, ["train", f"graph_dir={graph}", f"run_dir={run_dir}", *TRAIN, "train.epochs=5", "precision=bf16"]
    )
    assert result.exit_code == 2
    line = one_line(result.stderr)
    assert "training diverged in epoch 3" in line and "best.pt (epoch" in line and "kept and usable" in line
    assert "precision=fp32" in line
    assert [r["epoch"] for r in metrics(run_dir)] == [1, 2]  # the diverged epoch is not recorded
    assert torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)["epoch"] == 2
    monkeypatch.delenv("GNNSCALE_FAULT")
    infer = runner.invoke(app, ["infer", f"ckpt={run_dir}", f"run_dir={tmp_path / 'inf'}"])
    assert infer.exit_code == 0, infer.output
    assert np.isfinite(np.load(tmp_path / "inf" / "embeddings.npy")).all()


# ---------------------------------------------------------------- Ctrl-C
def test_ctrl_c_saves_says_how_to_resume_and_the_resumed_run_equals_an_uninterrupted_one(
    tmp_path, graph, uninterrupted
):
    run_dir = tmp_path / "run"
    job = gnnscale("train", f"graph_dir={graph}", f"run_dir={run_dir}", *TRAIN, fault=f"{MID_EPOCH_2}:int")
    assert job.returncode == 130, job.stderr
    line = one_line(job.stderr)
    assert "interrupted in epoch 2" in line and f"gnnscale train resume={run_dir}" in line
    assert torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)["epoch"] == 1
    assert not (run_dir / "summary.json").exists()
    resumed = runner.invoke(app, ["train", f"resume={run_dir}", f"graph_dir={graph}", *TRAIN])
    assert resumed.exit_code == 0, resumed.output
    assert_same_run(run_dir, uninterrupted)


# ---------------------------------------------------------------- read-only graph_dir
def _read_only(folder: Path) -> tuple[str, list[list[str]]]:
    """Make folder read-only for this process: chmod for a normal user; as root (whom chmod does not stop)
    a read-only bind mount. (how, the commands that undo it); skips when neither is possible."""
    if os.geteuid() != 0:
        for p in [folder, *folder.rglob("*")]:
            p.chmod(p.stat().st_mode & ~0o222)
        return "chmod", []
    bind = subprocess.run(["mount", "--bind", str(folder), str(folder)], capture_output=True)
    if bind.returncode != 0:
        pytest.skip(
            "running as root, where chmod a-w does not stop writes, and a read-only bind mount is not permitted here"
        )
    ro = subprocess.run(["mount", "-o", "remount,bind,ro", str(folder)], capture_output=True)
    if ro.returncode != 0:
        subprocess.run(["umount", str(folder)])
        pytest.skip(
            "running as root, where chmod a-w does not stop writes, and remounting read-only is not permitted here"
        )
    return "bind mount", [["umount", str(folder)]]


def test_train_and_infer_work_on_a_read_only_graph_dir(tmp_path, graph):
    g = shutil.copytree(graph, tmp_path / "g")
    _, undo = _read_only(g)
    try:
        with pytest.raises(OSError):
            (g / "probe").write_text("x")
        result = runner.invoke(app, ["train", f"graph_dir={g}", f"run_dir={tmp_path / 'run'}", *TRAIN])
        assert result.exit_code == 0, result.output
        assert says(result.stdout, "is read-only: verified, but no stamps recorded")
        infer = runner.invoke(app, ["infer", f"ckpt={tmp_path / 'run'}", f"run_dir={tmp_path / 'inf'}"])
        assert infer.exit_code == 0, infer.output
        verify = runner.invoke(app, ["verify", f"graph_dir={g}"])
        assert verify.exit_code == 0, verify.output
    finally:
        for cmd in undo:
            subprocess.run(cmd, check=True)
        for p in [g, *g.rglob("*")]:
            p.chmod(p.stat().st_mode | 0o200)


# ---------------------------------------------------------------- SIGKILL mid-stage
def test_shard_killed_leaves_no_graph_or_the_previous_one_and_the_rerun_is_bit_equal(tmp_path):
    g, ref = tmp_path / "g", tmp_path / "ref"
    args = [*TINY_SYNTHETIC, "data.seed=5"]
    # A fresh graph_dir: killed with shard 1 written but not renamed -> no graph_dir at all.
    job = gnnscale("shard", f"graph_dir={g}", *args, fault="write:part_00001.pt:kill", cwd=tmp_path)
    assert job.returncode == -signal.SIGKILL
    assert not g.exists()
    # An existing graph_dir replaced with overwrite=true: killed -> the previous graph, intact.
    assert (
        runner.invoke(
            app, ["shard", f"graph_dir={g}", f"run_dir={tmp_path / 'r0'}", *TINY_SYNTHETIC]
        ).exit_code
        == 0
    )
    before = (g / "meta.json").read_text()
    job = gnnscale(
        "shard", f"graph_dir={g}", *args, "overwrite=true", fault="write:meta.json:kill", cwd=tmp_path
    )
    assert job.returncode == -signal.SIGKILL
    assert (g / "meta.json").read_text() == before and all(c.ok for c in check_files(g, "full"))
    assert staging_dir_for(g).exists()  # hidden leftovers, never read as a graph
    rerun = runner.invoke(
        app, ["shard", f"graph_dir={g}", f"run_dir={tmp_path / 'r1'}", *args, "overwrite=true"]
    )
    assert rerun.exit_code == 0, rerun.output
    assert says(rerun.stdout, "taking over the lock of graph_dir") and not staging_dir_for(g).exists()
    assert (
        runner.invoke(app, ["shard", f"graph_dir={ref}", f"run_dir={tmp_path / 'r2'}", *args]).exit_code == 0
    )
    shards = lambda d: [s["sha256"] for s in json.loads((d / "meta.json").read_text())["shards"]]  # noqa: E731
    assert shards(g) == shards(ref)


@pytest.mark.parametrize("point", ["csc.shard#2", "write:meta.json"])
def test_build_csr_killed_leaves_no_usable_csc_and_the_rerun_is_bit_equal(tmp_path, graph, point):
    g = tmp_path / "g"
    shutil.copytree(graph, g, ignore=shutil.ignore_patterns("csc", ".verified.json"))
    meta = json.loads((g / "meta.json").read_text())
    reference = meta.pop("csc")["sha256"]
    (g / "meta.json").write_text(json.dumps(meta))
    job = gnnscale("build-csr", f"graph_dir={g}", fault=f"{point}:kill", cwd=tmp_path)
    assert job.returncode == -signal.SIGKILL
    assert "csc" not in json.loads((g / "meta.json").read_text())
    refused = runner.invoke(app, ["train", f"graph_dir={g}", f"run_dir={tmp_path / 'run'}", *TRAIN])
    assert refused.exit_code == 2 and "build-csr" in one_line(refused.stderr)
    rerun = runner.invoke(app, ["build-csr", f"graph_dir={g}", f"run_dir={tmp_path / 'r'}"])
    assert rerun.exit_code == 0, rerun.output
    assert json.loads((g / "meta.json").read_text())["csc"]["sha256"] == reference


@pytest.mark.parametrize("point", [MID_EPOCH_2, "write:last.pt#2"])
def test_train_killed_mid_epoch_or_mid_checkpoint_resumes_to_the_uninterrupted_run(
    tmp_path, graph, uninterrupted, point
):
    run_dir = tmp_path / "run"
    job = gnnscale("train", f"graph_dir={graph}", f"run_dir={run_dir}", *TRAIN, fault=f"{point}:kill")
    assert job.returncode == -signal.SIGKILL
    assert not (run_dir / "summary.json").exists()  # not a finished-looking run
    assert torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)["epoch"] == 1
    resumed = runner.invoke(app, ["train", f"resume={run_dir}", f"graph_dir={graph}", *TRAIN])
    assert resumed.exit_code == 0, resumed.output
    assert says(resumed.stdout, "taking over the lock")
    assert_same_run(run_dir, uninterrupted)
    assert not list((run_dir / "checkpoints").glob(".*.tmp"))  # a killed write's temporary file is gone


def test_infer_killed_mid_layer_leaves_no_result_and_the_rerun_is_bit_equal(tmp_path, graph, uninterrupted):
    args = [f"ckpt={uninterrupted}", "infer.batch_size=128"]
    job = gnnscale("infer", *args, f"run_dir={tmp_path / 'inf'}", fault="infer.batch#3:kill", cwd=tmp_path)
    assert job.returncode == -signal.SIGKILL
    assert not any(
        (tmp_path / "inf" / f).exists() for f in ("embeddings.npy", "emb_info.json", "summary.json")
    )
    rerun = runner.invoke(app, ["infer", *args, f"run_dir={tmp_path / 'inf'}"])
    assert rerun.exit_code == 0, rerun.output
    ref = runner.invoke(app, ["infer", *args, f"run_dir={tmp_path / 'ref'}"])
    assert ref.exit_code == 0, ref.output
    for f in ("embeddings.npy", "predictions.npy"):
        assert (tmp_path / "inf" / f).read_bytes() == (tmp_path / "ref" / f).read_bytes()


# ---------------------------------------------------------------- a full disk
@pytest.fixture
def small_disk(tmp_path):
    """A 1 MB tmpfs (root only: mounting needs it); skipped where it cannot be mounted."""
    folder = tmp_path / "disk"
    folder.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs to run out of space needs root")
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(folder)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=True)


def fill(disk: Path, leave: int = 0) -> Path:
    """Take the free space of disk, leaving about `leave` bytes."""
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
    try:
        chunk = 1 << 20
        while chunk >= 4096:
            if shutil.disk_usage(disk).free - chunk < leave:
                chunk //= 2
                continue
            try:
                os.write(fd, b"\0" * chunk)
            except OSError:
                chunk //= 2
    finally:
        os.close(fd)
    return filler


def test_shard_on_a_full_disk_exits_2_with_the_space_needed_and_leaves_nothing(small_disk, tmp_path):
    fill(small_disk, leave=16 << 10)
    g = small_disk / "g"
    result = runner.invoke(app, ["shard", f"graph_dir={g}", f"run_dir={tmp_path / 'r'}", *TINY_SYNTHETIC])
    assert result.exit_code == 2
    line = one_line(result.stderr)
    assert f"no space left on {small_disk}, need about" in line and "KB" in line
    assert not g.exists() and not staging_dir_for(g).exists()


def test_build_csr_on_a_full_disk_exits_2_and_the_rerun_with_space_works(small_disk, tmp_path, graph):
    g = small_disk / "g"
    shutil.copytree(graph, g, ignore=shutil.ignore_patterns("csc", ".verified.json"))
    meta = json.loads((g / "meta.json").read_text())
    reference = meta.pop("csc")["sha256"]
    (g / "meta.json").write_text(json.dumps(meta))
    filler = fill(small_disk, leave=8 << 10)
    result = runner.invoke(app, ["build-csr", f"graph_dir={g}", f"run_dir={tmp_path / 'r'}"])
    assert result.exit_code == 2
    assert f"no space left on {g}, need about" in one_line(result.stderr)
    assert not (g / "csc").exists() and not (g / ".csc.partial").exists()
    assert "csc" not in json.loads((g / "meta.json").read_text())
    filler.unlink()
    assert runner.invoke(app, ["build-csr", f"graph_dir={g}", f"run_dir={tmp_path / 'r'}"]).exit_code == 0
    assert json.loads((g / "meta.json").read_text())["csc"]["sha256"] == reference


def test_a_checkpoint_write_on_a_full_disk_keeps_the_previous_one(small_disk, graph, uninterrupted):
    from gnnscale.models.checkpoint import read_checkpoint
    from gnnscale.stages import train
    from gnnscale.utils.diskspace import DiskFullError
    from tests.conftest import compose

    run_dir = small_disk / "run"

    def full_after_epoch_1(epoch: int) -> None:
        if epoch == 1:
            fill(small_disk)

    with pytest.raises(DiskFullError) as caught:
        train.run(compose("train", f"graph_dir={graph}", f"run_dir={run_dir}", *TRAIN), full_after_epoch_1)
    line = caught.value.one_line()
    assert f"no space left on {run_dir / 'checkpoints'}, need about" in line and "KB" in line
    assert read_checkpoint(run_dir / "checkpoints" / "last.pt")["epoch"] == 1  # intact, and its sha256 checks
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == [
        "best.pt",
        "last.pt",
        "sha256.json",
    ]
    (small_disk / "filler").unlink()
    resumed = runner.invoke(app, ["train", f"resume={run_dir}", f"graph_dir={graph}", *TRAIN])
    assert resumed.exit_code == 0, resumed.output
    assert_same_run(run_dir, uninterrupted)


def test_infer_on_a_full_disk_exits_2_before_writing(small_disk, uninterrupted):
    fill(small_disk, leave=8 << 10)
    run_dir = small_disk / "inf"
    result = runner.invoke(app, ["infer", f"ckpt={uninterrupted}", f"run_dir={run_dir}"])
    assert result.exit_code == 2
    assert f"no space left on {run_dir}, need about" in one_line(result.stderr)
    assert not any((run_dir / f).exists() for f in ("embeddings.npy", "emb_info.json", "summary.json"))


def test_recommend_on_a_full_disk_exits_2_before_writing(small_disk, graph, tmp_path):
    infer_dir = fake_infer_run(tmp_path / "inf", graph)
    run_dir = small_disk / "rec"
    recommend = ["recommend", f"infer_dir={infer_dir}", f"run_dir={run_dir}", "recommend.k=20"]
    filler = fill(small_disk, leave=8 << 10)
    result = runner.invoke(app, recommend)
    assert result.exit_code == 2
    assert f"no space left on {run_dir}, need about" in one_line(result.stderr)
    assert not any((run_dir / f).exists() for f in ("recommendations.npy", "scores.npy", "summary.json"))
    filler.unlink()  # 600 x 20 slots (~140 KB) fit in the 1 MB disk: the estimate is not far off
    assert runner.invoke(app, recommend).exit_code == 0
