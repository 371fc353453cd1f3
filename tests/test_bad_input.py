"""Bad input never yields a valid-looking graph_dir: it fails with exit 2 and one line that says the fix."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from gnnscale.cli import app
from gnnscale.errors import DataError
from gnnscale.storage.shard_writer import EdgePolicy, ShardWriter, staging_dir_for
from tests.conftest import TINY_SYNTHETIC

runner = CliRunner()


def writer(tmp_path, **kw) -> ShardWriter:
    args = dict(name="t", num_nodes=10, feat_dim=2, num_classes=3, nodes_per_shard=4, policy=EdgePolicy())
    args.update(kw)
    return ShardWriter(tmp_path / "g", **args)


def good_nodes(w: ShardWriter, n: int = 10) -> None:
    w.add_nodes(0, np.ones((n, 2), np.float32), np.zeros(n, np.int64), None)


@pytest.mark.parametrize(
    "feed, message",
    [
        (
            lambda w: w.add_edges(np.array([0, 1]), np.array([1, 10])),
            "edge endpoint 10 is out of range for 10 nodes",
        ),
        (lambda w: w.add_edges(np.array([-1]), np.array([1])), "edge endpoint -1 is out of range"),
        (
            lambda w: w.add_nodes(0, np.ones((11, 2), np.float32), np.zeros(11, np.int64), None),
            "feature rows exceed the node count",
        ),
        (
            lambda w: w.add_nodes(0, np.full((10, 2), np.nan, np.float32), np.zeros(10, np.int64), None),
            "NaN or inf",
        ),
        (
            lambda w: w.add_nodes(0, np.full((10, 2), np.inf, np.float32), np.zeros(10, np.int64), None),
            "NaN or inf",
        ),
        (
            lambda w: w.add_nodes(0, np.ones((10, 2), np.float32), np.full(10, 3), None),
            "label 3 is out of range for 3 classes",
        ),
        (
            lambda w: w.add_nodes(0, np.ones((10, 2), np.float32), np.full(10, -2), None),
            "label -2 is out of range",
        ),
        (
            lambda w: w.add_nodes(0, np.ones((10, 3), np.float32), np.zeros(10, np.int64), None),
            "expected (*, 2)",
        ),
    ],
)
def test_writer_rejects_bad_input(tmp_path, feed, message):
    w = writer(tmp_path)
    with pytest.raises(
        DataError, match=message.replace("(", r"\(").replace(")", r"\)").replace("*", r"\*")
    ) as info:
        feed(w)
    assert info.value.hint  # every user error says how to fix it
    w.abort()
    assert not (tmp_path / "g").exists() and not staging_dir_for(tmp_path / "g").exists()


def test_too_few_feature_rows_is_refused_at_finish(tmp_path):
    w = writer(tmp_path)
    good_nodes(w, 7)
    with pytest.raises(DataError, match="features cover 7 of 10 nodes"):
        w.finish()
    w.abort()
    assert not (tmp_path / "g").exists()


def test_failure_mid_stream_publishes_nothing(tmp_path, monkeypatch):
    from gnnscale.datasets.synthetic import SyntheticSource

    def broken(self):
        yield np.array([0]), np.array([1])
        raise DataError("the edge file ends mid-record", "re-download it")

    monkeypatch.setattr(SyntheticSource, "edge_chunks", broken)
    result = runner.invoke(
        app, ["shard", f"graph_dir={tmp_path / 'g'}", f"run_dir={tmp_path / 'r'}", *TINY_SYNTHETIC]
    )
    assert result.exit_code == 2 and "error: the edge file ends mid-record; re-download it" in result.stderr
    assert not (tmp_path / "g").exists() and not staging_dir_for(tmp_path / "g").exists()


def _shard(tmp_path, *extra):
    return runner.invoke(
        app, ["shard", f"graph_dir={tmp_path / 'g'}", f"run_dir={tmp_path / 'r'}", *TINY_SYNTHETIC, *extra]
    )


def test_existing_graph_dir_needs_overwrite(tmp_path):
    assert _shard(tmp_path).exit_code == 0
    again = _shard(tmp_path, "data.seed=5")
    assert again.exit_code == 2 and "already exists" in again.stderr and "overwrite=true" in again.stderr
    assert _shard(tmp_path, "data.seed=5", "overwrite=true").exit_code == 0


def test_overwrite_never_deletes_a_folder_that_is_not_a_graph_dir(tmp_path):
    (tmp_path / "g").mkdir()
    (tmp_path / "g" / "thesis.tex").write_text("precious")
    result = _shard(tmp_path, "overwrite=true")
    assert result.exit_code == 2 and "is not a graph_dir" in result.stderr
    assert (tmp_path / "g" / "thesis.tex").read_text() == "precious"


def test_checksum_mismatch_is_caught(tmp_path):
    assert _shard(tmp_path).exit_code == 0
    shard = tmp_path / "g" / "part_00001.pt"
    data = bytearray(shard.read_bytes())
    data[-100] ^= 0xFF
    shard.write_bytes(bytes(data))
    result = runner.invoke(app, ["build-csr", f"graph_dir={tmp_path / 'g'}", f"run_dir={tmp_path / 'r2'}"])
    assert result.exit_code == 2
    assert "checksum mismatch for" in result.stderr and "part_00001.pt" in result.stderr
    assert not (tmp_path / "g" / "csc").exists()


def test_missing_shard_is_caught(tmp_path):
    assert _shard(tmp_path).exit_code == 0
    (tmp_path / "g" / "part_00002.pt").unlink()
    result = runner.invoke(app, ["build-csr", f"graph_dir={tmp_path / 'g'}", f"run_dir={tmp_path / 'r2'}"])
    assert result.exit_code == 2 and "part_00002.pt is missing" in result.stderr


def test_interrupted_shard_dir_without_meta_is_not_a_graph(tmp_path):
    (tmp_path / "g").mkdir()
    (tmp_path / "g" / "part_00000.pt").write_bytes(b"half")
    result = runner.invoke(app, ["build-csr", f"graph_dir={tmp_path / 'g'}", f"run_dir={tmp_path / 'r2'}"])
    assert result.exit_code == 2 and "has no meta.json" in result.stderr


# ---------------------------------------------------------------- an edge list's first line
def _shard_edges(tmp_path, text: str):
    (tmp_path / "e.csv").write_text(text)
    np.save(tmp_path / "y.npy", np.zeros(4, dtype=np.int64))
    return runner.invoke(
        app,
        [
            "shard",
            f"graph_dir={tmp_path / 'g'}",
            f"run_dir={tmp_path / 'r'}",
            "data=edgelist",
            f"data.path={tmp_path / 'e.csv'}",
            f"data.labels={tmp_path / 'y.npy'}",
        ],
    )


@pytest.mark.parametrize(
    "text, number, line",
    [
        ("0,1.5\n1,2\n2,3\n", 1, "0,1.5"),  # a float node id, not column names
        ("# SNAP comment\n\n1.5,2\n1,2\n", 3, "1.5,2"),  # numbered as in the file: comments count
        ("a,b,0.5\n1,2,0.5\n", 1, "a,b,0.5"),  # a number in any column makes it data
        ("node,7\n1,2\n", 1, "node,7"),
    ],
    ids=["float-id", "after-comments", "weight-column", "half-header"],
)
def test_malformed_first_edge_line_is_not_taken_for_a_header(tmp_path, text, number, line):
    result = _shard_edges(tmp_path, text)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    assert f"line {number} of edge file '{tmp_path / 'e.csv'}'" in lines[0], lines[0]
    assert repr(line) in lines[0] and f"fix or delete line {number}" in lines[0], lines[0]
    assert not (tmp_path / "g").exists() and not staging_dir_for(tmp_path / "g").exists()


@pytest.mark.parametrize(
    "text",
    [
        "src,dst\n0,1\n1,2\n2,3\n",
        "# c\nsource,target,weight\n0,1,0.5\n1,2,2\n2,3,1e3\n",
        "from , to\n0,1\n1,2\n2,3\n",
    ],
    ids=["csv", "after-comment-with-weights", "spaced"],
)
def test_a_real_header_is_still_skipped(tmp_path, text):
    result = _shard_edges(tmp_path, text)
    assert result.exit_code == 0, result.output
    meta = json.loads((tmp_path / "g" / "meta.json").read_text())
    assert meta["input_edges"] == 3  # the header is not an edge, and no edge was dropped with it
