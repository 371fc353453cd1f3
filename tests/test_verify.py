"""Integrity where data is read: a changed byte in a shard, the CSC or a checkpoint stops the next stage
that reads it (exit 2, one line naming the file and the fix); unchanged files are not re-hashed."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch
from typer.testing import CliRunner

from gnnscale.cli import app
from gnnscale.storage.verify import RACY_NS, STAMP_FILE, check_files
from tests.conftest import TINY_SYNTHETIC, build_graph, fake_infer_run

runner = CliRunner()
TRAIN = ("+exp=debug_tiny", "train.epochs=2", "train.diagnostics=false")


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    return build_graph(tmp_path_factory.mktemp("verify"), *TINY_SYNTHETIC)


@pytest.fixture
def graph(tmp_path, pristine):
    """A private copy (the tests change bytes in it)."""
    return shutil.copytree(pristine, tmp_path / "graph")


def flip(path, where: float) -> None:
    """Change one byte in place (same size, same inode), as a disk or a stray write would."""
    with open(path, "r+b") as fh:
        fh.seek(int(os.path.getsize(path) * where))
        byte = fh.read(1)
        fh.seek(-1, os.SEEK_CUR)
        fh.write(bytes([byte[0] ^ 0x01]))


def age_stamps(graph) -> None:
    """Stamps taken long after the files last changed (not 'racy'): what a graph_dir used later looks like."""
    path = graph / STAMP_FILE
    stamps = json.loads(path.read_text())
    for s in stamps["files"].values():
        s["at_ns"] += 2 * RACY_NS
    path.write_text(json.dumps(stamps))


def train(tmp_path, graph, *extra):
    return runner.invoke(app, ["train", f"graph_dir={graph}", f"run_dir={tmp_path / 'run'}", *TRAIN, *extra])


def test_build_csr_records_the_csc_checksums(pristine):
    meta = json.loads((pristine / "meta.json").read_text())
    assert set(meta["csc"]["sha256"]) == {"indptr.npy", "indices.npy"}
    assert all(c.status == "ok (hashed)" for c in check_files(pristine, "full"))


@pytest.mark.parametrize(
    "file, where",
    [
        ("part_00001.pt", 0.3),  # feature rows
        ("part_00001.pt", 0.6),
        ("part_00000.pt", 0.95),  # edge arrays / masks at the end
        ("csc/indices.npy", 0.5),
        ("csc/indptr.npy", 0.9),
    ],
)
def test_a_flipped_byte_stops_train(tmp_path, graph, file, where):
    assert train(tmp_path, graph).exit_code == 0  # verifies and stamps every file
    age_stamps(graph)
    flip(graph / file, where)
    result = train(tmp_path, graph, "overwrite=true")
    assert result.exit_code == 2, result.output
    line = result.stderr.strip()
    assert len(line.splitlines()) == 1 and "checksum mismatch for" in line and file in line
    fix = "gnnscale build-csr" if file.startswith("csc") else "gnnscale shard"
    assert fix in line


def test_a_flipped_byte_stops_infer_and_partition(tmp_path, graph):
    assert train(tmp_path, graph).exit_code == 0
    flip(graph / "part_00002.pt", 0.5)
    result = runner.invoke(app, ["infer", f"ckpt={tmp_path / 'run'}", f"run_dir={tmp_path / 'inf'}"])
    assert result.exit_code == 2 and "part_00002.pt" in result.stderr and "gnnscale shard" in result.stderr
    result = runner.invoke(app, ["partition", f"graph_dir={graph}", f"run_dir={tmp_path / 'p'}"])
    assert result.exit_code == 2 and "part_00002.pt" in result.stderr
    assert not (graph / "partitions").exists() or not any((graph / "partitions").glob("*/assignment.npy"))


def test_a_flipped_byte_stops_recommend(tmp_path, graph):
    """recommend reads the CSC (the neighbours it leaves out): a changed byte there is exit 2 naming the
    file, before any output is written."""
    infer_dir = fake_infer_run(tmp_path / "inf", graph)

    def recommend(name, *extra):
        args = ["recommend", f"infer_dir={infer_dir}", f"run_dir={tmp_path / name}", "recommend.k=5", *extra]
        return runner.invoke(app, args)

    assert recommend("ok").exit_code == 0  # verifies and stamps every file
    age_stamps(graph)
    flip(graph / "csc" / "indices.npy", 0.5)
    result = recommend("bad")
    assert result.exit_code == 2, result.output
    line = result.stderr.strip()
    assert len(line.splitlines()) == 1 and "checksum mismatch for" in line and "csc/indices.npy" in line
    assert f"gnnscale build-csr graph_dir={graph}" in line
    assert not (tmp_path / "bad").exists()  # refused before the run folder is made


def test_matching_stamps_are_not_rehashed_and_full_rehashes(tmp_path, graph):
    check_files(graph, "stamp")
    age_stamps(graph)
    assert {c.status for c in check_files(graph, "stamp")} == {"ok (stamp)"}
    assert {c.status for c in check_files(graph, "full")} == {"ok (hashed)"}
    # verify=off reads nothing: a changed file goes unnoticed, as asked
    flip(graph / "part_00001.pt", 0.3)
    assert train(tmp_path, graph, "verify=off").exit_code == 0
    assert train(tmp_path, graph, "overwrite=true").exit_code == 2


def test_a_fresh_stamp_is_not_trusted(graph):
    """A stamp taken in the same clock tick as the file's last write could hide a later write: re-hashed."""
    check_files(graph, "stamp")
    assert {c.status for c in check_files(graph, "stamp")} == {"ok (hashed)"}


def test_verify_command_prints_a_table_and_fails_on_a_changed_file(graph):
    ok = runner.invoke(app, ["verify", f"graph_dir={graph}"])
    assert ok.exit_code == 0, ok.output
    assert "part_00000.pt" in ok.stdout and "csc/indices.npy" in ok.stdout and "ok (hashed)" in ok.stdout
    flip(graph / "csc" / "indices.npy", 0.7)
    bad = runner.invoke(app, ["verify", f"graph_dir={graph}"])
    assert bad.exit_code == 2 and "MISMATCH" in bad.stdout
    assert "csc/indices.npy" in bad.stderr and f"gnnscale build-csr graph_dir={graph}" in bad.stderr
    assert runner.invoke(app, ["verify", f"graph_dir={graph}", "verify=sometimes"]).exit_code == 2


def test_a_missing_csc_file_is_named(graph):
    (graph / "csc" / "indptr.npy").unlink()
    result = runner.invoke(app, ["verify", f"graph_dir={graph}", "verify=stamp"])
    assert result.exit_code == 2 and "indptr.npy is missing" in result.stderr


# ---------------------------------------------------------------- checkpoints
def test_a_flipped_checkpoint_byte_stops_infer_and_resume(tmp_path, graph):
    assert train(tmp_path, graph).exit_code == 0
    ckpts = tmp_path / "run" / "checkpoints"
    assert set(json.loads((ckpts / "sha256.json").read_text())) >= {"best.pt", "last.pt"}
    flip(ckpts / "best.pt", 0.5)
    result = runner.invoke(app, ["infer", f"ckpt={tmp_path / 'run'}", f"run_dir={tmp_path / 'inf'}"])
    assert result.exit_code == 2 and "best.pt does not match the sha256" in result.stderr
    flip(ckpts / "last.pt", 0.5)
    result = runner.invoke(
        app, ["train", f"resume={tmp_path / 'run'}", f"graph_dir={graph}", *TRAIN, "train.epochs=3"]
    )
    assert result.exit_code == 2 and "last.pt does not match the sha256" in result.stderr


@pytest.mark.parametrize("version", [99, 0, "1"])
def test_a_checkpoint_of_an_unknown_format_version_is_refused(tmp_path, graph, version):
    assert train(tmp_path, graph).exit_code == 0
    ckpt = torch.load(tmp_path / "run" / "checkpoints" / "best.pt", weights_only=True)
    ckpt["format_version"] = version
    torch.save(ckpt, tmp_path / "other.pt")
    result = runner.invoke(app, ["infer", f"ckpt={tmp_path / 'other.pt'}", f"run_dir={tmp_path / 'inf'}"])
    assert result.exit_code == 2
    line = result.stderr.strip()
    assert len(line.splitlines()) == 1 and f"format version {version!r}" in line
