"""The layering holds: cli -> stages -> pipeline -> training / inference / partition -> tasks -> storage,
sampling, models, config, datasets -> utils. A package imports only from its own layer or the ones below."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "gnnscale"
LAYERS = {
    "utils": 0,
    "errors": 0,
    "storage": 1,
    "sampling": 1,
    "models": 1,
    "config": 1,
    "datasets": 1,
    "tasks": 2,
    "training": 3,
    "inference": 3,
    "recommend": 3,
    "partition": 3,
    "dist": 3,
    "pipeline": 4,
    "profile": 4,
    "stages": 5,
    "cli": 6,
}


def _imports(path: Path) -> list[tuple[str, int]]:
    """(top-level gnnscale package, line) of every gnnscale import in a file, lazy ones included."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        out += [(n.split(".")[1], node.lineno) for n in names if n.startswith("gnnscale.")]
    return out


def _layer_of(path: Path) -> str:
    rel = path.relative_to(PACKAGE)
    return rel.parts[0].removesuffix(".py")


def test_no_module_imports_a_layer_above_its_own():
    files = [p for p in PACKAGE.rglob("*.py") if _layer_of(p) in LAYERS]
    assert len(files) > 40
    upward = [
        f"{p.relative_to(PACKAGE)}:{line} imports gnnscale.{target}"
        for p in files
        for target, line in _imports(p)
        if LAYERS[target] > LAYERS[_layer_of(p)]
    ]
    assert upward == []


def test_storage_is_free_of_dgl():
    hits = [
        f"{p.relative_to(PACKAGE)}:{line}"
        for p in (PACKAGE / "storage").rglob("*.py")
        for line, text in enumerate(p.read_text().splitlines(), 1)
        if "import dgl" in text
    ]
    assert hits == []


def test_stages_are_thin():
    """A stage composes, calls its package and renders: at most 200 lines, run() at most 60."""
    too_long = []
    for p in sorted((PACKAGE / "stages").glob("*.py")):
        text = p.read_text()
        if len(text.splitlines()) > 200:
            too_long.append(f"{p.name}: {len(text.splitlines())} lines")
        for node in ast.parse(text).body:
            if (
                isinstance(node, ast.FunctionDef)
                and node.name == "run"
                and node.end_lineno - node.lineno >= 60
            ):
                too_long.append(f"{p.name}: run() is {node.end_lineno - node.lineno + 1} lines")
    assert too_long == []


def test_one_module_unpickles_checkpoints():
    hits = sorted(
        str(p.relative_to(PACKAGE))
        for p in PACKAGE.rglob("*.py")
        if "torch.load(" in p.read_text()
        and p.name != "graph_dir.py"  # graph_dir.py: shards, not checkpoints
    )
    assert hits == ["models/checkpoint.py"]
