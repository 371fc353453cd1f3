"""A pipeline run's headline: the numbers a user looks for, gathered from the stages' own summaries."""

from __future__ import annotations

import json
from pathlib import Path

from omegaconf import DictConfig

from gnnscale.recommend.output import read_examples
from gnnscale.storage.meta import META_FILE
from gnnscale.storage.run_dir import EMBEDDINGS
from gnnscale.tasks.link_metrics import LINK_METRICS

EXAMPLES = (3, 5)  # task=link: the recommendations shown, (nodes, partners each)


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
        if tr.get("task") == "link":  # every ranking metric on the test edges, and what they ranked against
            out.update(
                task="link",
                edge_split=tr.get("edge_split"),
                eval_negatives=tr.get("eval_negatives"),
                link_test={m: tr.get(f"test_{m}") for m in LINK_METRICS},
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
    rec = results.get("recommend")
    if rec:
        out.update(
            recommendations=str(Path(rec["run_dir"]) / rec["files"][0]),
            recommend_k=rec["k"],
            recommend_queries=rec["queries"],
            recommend_index=rec["index"]["kind"],
            recommend_recall=rec.get("recall"),
            examples=read_examples(Path(rec["run_dir"]), rec["files"], *EXAMPLES),
            recommend_run_dir=rec["run_dir"],
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
        if "link_test" in h:
            rows.update(_link_rows(h))
        else:
            rows[f"test {h['metric']} (train, sampled)"] = _fmt(h["train_test"])
    if "infer_mode" in h:
        if h.get("task") != "link":  # a link model has no class predictions to score
            rows[f"test acc (infer, {h['infer_mode']})"] = _fmt(h["infer_test_acc"])
        rows["embeddings"] = f"{h['embeddings']} ({' x '.join(map(str, h['embeddings_shape']))})"
    if "recommendations" in h:
        rows.update(_recommend_rows(h))
    wall = summary["wall_time_s"]
    times = [f"{s} {'reused' if results[s].get('skipped') else format(wall[s], '.1f')}" for s in results]
    rows["wall time (s)"] = " · ".join([*times, f"total {wall['total']:.1f}"])
    return rows


def _link_rows(h: dict) -> dict:
    t, e = h["link_test"], h.get("eval_negatives")
    against = "all nodes, filtered" if not e else f"{e:,} sampled negatives each"
    hits = " / ".join(_fmt(t[m]) for m in LINK_METRICS if m.startswith("hits@"))
    ks = "/".join(m.split("@")[1] for m in LINK_METRICS if m.startswith("hits@"))
    return {
        f"test auc / mrr ({against})": f"{_fmt(t['auc'])} / {_fmt(t['mrr'])}",
        f"test hits@{ks}": hits,
    }


def _recommend_rows(h: dict) -> dict:
    k, rec = h["recommend_k"], h.get("recommend_recall") or {}
    recall = f", recall@{k} {rec[f'recall_at_{k}']} vs exact" if rec else ""
    rows = {
        "recommendations": (
            f"{h['recommendations']} ({h['recommend_queries']:,} nodes x top-{k}, "
            f"{h['recommend_index']} index{recall})"
        )
    }
    for ex in h["examples"]:
        top = " · ".join(f"{c} ({s:.3g})" for c, s in ex["partners"])
        rows[f"node {ex['node']}: top {len(ex['partners'])}"] = top or "(no candidates)"
    return rows
