"""A quiet start (no dependency's import-time notice before gnnscale's own output, real warnings kept) and
two settings that used to run into a confusing result instead of a refusal naming the value."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gnnscale.cli import app
from tests.conftest import build_graph

runner = CliRunner()
REPO = Path(__file__).resolve().parents[1]
CUDA_NOTICE = "No CUDA runtime"
DGL_NOTICE = "DGL backend not selected"


def _env(tmp_path: Path) -> dict:
    """What makes PyTorch and DGL print on import: a CUDA toolkit without a GPU (CUDA_HOME pointing at a
    folder that exists) and no DGL backend chosen (no DGLBACKEND, no ~/.dgl/config.json)."""
    env = {k: v for k, v in os.environ.items() if k != "DGLBACKEND"}
    env.update(CUDA_HOME=str(tmp_path), DGLDEFAULTDIR=str(tmp_path / "dgl"), PYTHONPATH=str(REPO))
    return env


def _gnnscale(*args: str) -> list[str]:
    script = Path(sys.executable).with_name("gnnscale")
    return [str(script), *args] if script.is_file() else [sys.executable, "-m", "gnnscale", *args]


# profile on a described graph imports torch.utils.benchmark, which imports the module that prints
@pytest.mark.parametrize(
    "args",
    [
        ("--help",),
        ("shard", "--cfg"),
        ("profile", "profile.num_nodes=1e6", "profile.avg_degree=10", "profile.plots=false", "run_dir=p"),
    ],
)
def test_commands_start_without_import_notices(tmp_path, args):
    result = subprocess.run(
        _gnnscale(*args), env=_env(tmp_path), cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    assert CUDA_NOTICE not in result.stderr and DGL_NOTICE not in result.stderr, result.stderr


def test_notices_are_filtered_where_they_are_printed_and_real_warnings_still_show(tmp_path):
    code = (
        "import sys, warnings; {pre}import dgl, torch, torch.utils.cpp_extension; "
        "print('cuda', torch.cuda.is_available()); warnings.warn('a real warning'); "
        "print('plain stderr line', file=sys.stderr)"
    )
    run = lambda pre: subprocess.run(  # noqa: E731
        [sys.executable, "-c", code.format(pre=pre)],
        cwd=tmp_path,
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    raw, quiet = run(""), run("import gnnscale; ")
    assert raw.returncode == 0 and quiet.returncode == 0, raw.stderr + quiet.stderr
    if "cuda False" in raw.stdout:  # the notices appear only on a machine without a usable GPU
        assert CUDA_NOTICE in raw.stderr and DGL_NOTICE in raw.stderr, raw.stderr  # what is filtered exists
    assert CUDA_NOTICE not in quiet.stderr and DGL_NOTICE not in quiet.stderr, quiet.stderr
    assert "a real warning" in quiet.stderr and "plain stderr line" in quiet.stderr


def _one_line(stderr: str) -> str:
    """The error line (the console may wrap it: one `error:`, no traceback), joined back into one line."""
    assert stderr.strip().startswith("error: ") and stderr.count("error:") == 1 and "Traceback" not in stderr
    return " ".join(stderr.split())


def test_link_split_with_nothing_held_out_exits_2_naming_the_counts(tmp_path):
    edges = tmp_path / "edges.csv"
    edges.write_text("0,1\n1,2\n")  # 3 nodes, 2 edges: 5% / 10% of them round to no val or test edge
    graph = build_graph(tmp_path, "data=edgelist", f"data.path={edges}", "data.features=none")
    run_dir = tmp_path / "r"
    result = runner.invoke(app, ["train", f"graph_dir={graph}", f"run_dir={run_dir}", "+exp=sage_link"])
    assert result.exit_code == 2, result.output
    line = _one_line(result.stderr)
    assert "0 validation and 0 test edges" in line
    assert "task.val_fraction=0.05" in line and "task.test_fraction=0.1" in line  # the values that did it
    assert "more edges" in line and "task.split_file" in line  # and what to change
    assert not run_dir.exists()  # refused before a run folder was made


def test_profile_with_a_negative_node_count_names_the_value(tmp_path):
    result = runner.invoke(app, ["profile", "profile.num_nodes=-5", f"run_dir={tmp_path / 'p'}"])
    assert result.exit_code == 2, result.output
    line = _one_line(result.stderr)
    assert "profile.num_nodes=-5" in line and "graphs/synthetic" not in line
    assert not (tmp_path / "p").exists()
