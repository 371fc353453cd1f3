"""A pipeline run's headline: the numbers a user looks for, gathered from the stages' own summaries."""

from __future__ import annotations

import json
from pathlib import Path

from omegaconf import DictConfig

from gnnscale.storage.meta import META_FILE
from gnnscale.storage.run_dir import EMBEDDINGS


def headline(cfg: DictConfig, results: dict) -> dict:
    """The numbers a user looks for after a pipeline run, from the stages' own summaries."""
    out: dict = {}
    meta_path = Path(cfg.graph_dir) / META_FILE
    if meta_path.is_file():
        meta = json.loads(meta_path.read_text())
        out.update(graph=meta["name"], num_nodes=meta["num_nodes"], num_edges=meta["num_edges"])
    tr = results.get("train")
    if tr:
        metric = tr["metric"]
        out.update(
            model=tr["model"],
            fanouts=tr["fanouts"],
            sampler=(tr.get("sampler") or {}).get("kind", "neighbor"),
            epochs_run=tr["epochs_run"],
            early_stopped=tr["early_stopped"],
            metric=metric,
            train_test=tr.get(f"test_{metric}"),
            train_run_dir=tr["run_dir"],
        )
    inf = results.get("infer")
    if inf:
        out.update(
            infer_mode=inf["mode"],
            infer_test_acc=inf.get("test_acc"),
            embeddings=str(Path(inf["run_dir"]) / EMBEDDINGS),
            embeddings_shape=inf["embeddings"]["shape"],
            infer_run_dir=inf["run_dir"],
        )
    return out


def _fmt(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.4f}"


def summary_rows(summary: dict) -> dict:
    """The table `gnnscale pipeline` ends with."""
    h, results = summary["headline"], summary["stages"]
    rows: dict = {}
    if "graph" in h:
        rows["graph"] = f"{h['graph']} ({summary['graph_dir']})"
        rows["nodes / edges"] = f"{h['num_nodes']:,} / {h['num_edges']:,}"
    if "model" in h:
        m = h["model"]
        formation = h.get("sampler", "neighbor") + (
            f" {h['fanouts']}" if h.get("fanouts") is not None else ""
        )
        rows["model"] = f"{m['arch']} {m['num_layers']}x{m['hidden']}, {formation}"
        rows["epochs run"] = f"{h['epochs_run']}{' (early stop)' if h['early_stopped'] else ''}"
        rows[f"test {h['metric']} (train, sampled)"] = _fmt(h["train_test"])
    if "infer_mode" in h:
        rows[f"test acc (infer, {h['infer_mode']})"] = _fmt(h["infer_test_acc"])
        rows["embeddings"] = f"{h['embeddings']} ({' x '.join(map(str, h['embeddings_shape']))})"
    wall = summary["wall_time_s"]
    times = [f"{s} {'reused' if results[s].get('skipped') else format(wall[s], '.1f')}" for s in results]
    rows["wall time (s)"] = " · ".join([*times, f"total {wall['total']:.1f}"])
    return rows
