"""Config composition and the CLI contract: overrides, --cfg, --help, exit codes and one-line errors."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from gnnscale.cli import app
from gnnscale.config import compose_config
from gnnscale.errors import ConfigError

runner = CliRunner()


def test_defaults_compose_with_synthetic_data():
    cfg = compose_config("shard")
    assert cfg.data.source == "synthetic"
    assert cfg.graph_dir == "graphs/synthetic"
    assert cfg.shard.nodes_per_shard == 100_000


def test_overrides_apply_and_interpolate():
    cfg = compose_config(
        "shard", ["data=planetoid", "data.path=/x", "data.name=cora", "shard.nodes_per_shard=7"]
    )
    assert (cfg.data.source, cfg.data.path, cfg.graph_dir, cfg.shard.nodes_per_shard) == (
        "planetoid",
        "/x",
        "graphs/cora",
        7,
    )


@pytest.mark.parametrize(
    "override, expected",
    [
        ("shard.nodez=1", "unknown config key 'shard.nodez'; valid keys under 'shard': nodes_per_shard"),
        ("bogus=1", "unknown config key 'bogus'; valid keys at the top level:"),
        ("data.num_nodes=abc", "config key 'data.num_nodes' expects integer, got 'abc'"),
        ("data=nope", "unknown option 'data=nope'; choose one of data="),
    ],
)
def test_bad_config_is_one_line_exit_2(override, expected):
    result = runner.invoke(app, ["shard", override])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")
    assert expected in lines[0]
    assert "Traceback" not in result.stderr


def test_group_specific_keys_are_validated():
    # num_nodes belongs to the synthetic source, not to planetoid
    with pytest.raises(ConfigError, match="unknown config key 'data.num_nodes'"):
        compose_config("shard", ["data=planetoid", "data.num_nodes=5"])


def test_cfg_prints_composed_config_and_runs_nothing(tmp_path):
    result = runner.invoke(app, ["shard", "--cfg", f"graph_dir={tmp_path / 'g'}", "data.num_nodes=123"])
    assert result.exit_code == 0
    assert "num_nodes: 123" in result.stdout
    assert not (tmp_path / "g").exists()


@pytest.mark.parametrize("command", ["shard", "build-csr", "pipeline"])
def test_help_teaches_with_examples(command):
    result = runner.invoke(app, [command, "--help"])
    assert result.exit_code == 0
    assert "Examples" in result.stdout and f"gnnscale {command}" in result.stdout


def test_missing_graph_dir_is_exit_2(tmp_path):
    result = runner.invoke(app, ["build-csr", f"graph_dir={tmp_path / 'nope'}", f"run_dir={tmp_path / 'r'}"])
    assert result.exit_code == 2
    assert "does not exist" in result.stderr and "gnnscale shard" in result.stderr


@pytest.mark.parametrize(
    "command, override, expected",
    [
        ("train", "train.log_every=5", "unknown config key 'train.log_every'; valid keys under 'train':"),
        ("pipeline", "train.log_every=5", "unknown config key 'train.log_every'; valid keys under 'train':"),
        (
            "build-csr",
            "csc.chunk_edges=10",
            "unknown config key 'csc.chunk_edges'; valid keys under 'csc': validate",
        ),
        (
            "pipeline",
            "csc.chunk_edges=10",
            "unknown config key 'csc.chunk_edges'; valid keys under 'csc': validate",
        ),
    ],
)
def test_options_nothing_reads_are_refused(tmp_path, command, override, expected):
    """A setting that would be accepted and then ignored is not offered: it fails like any unknown key."""
    result = runner.invoke(app, [command, override, f"run_dir={tmp_path / 'r'}"])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], lines
    assert "log_every" not in lines[0].split("valid keys")[1] and not (tmp_path / "r").exists()
