"""`gnnscale shard`: raw graph -> graph_dir (meta.json + part_NNNNN.pt node-range shards)."""

from __future__ import annotations

from omegaconf import DictConfig

from gnnscale.datasets import build_source, source_fingerprint
from gnnscale.stages.common import metered
from gnnscale.storage.lock import graph_lock_path, hold
from gnnscale.storage.node_order import check_method, order_files
from gnnscale.storage.run_dir import make_run_dir, write_summary
from gnnscale.storage.shard_writer import EdgePolicy, ShardWriter
from gnnscale.storage.verify import stamp_written
from gnnscale.utils.ui import info, make_progress, summary_table


def run(cfg: DictConfig) -> dict:
    check_method(cfg.shard.reorder)  # before any work: a typo is one line, not a shard run thrown away
    run_dir = make_run_dir(cfg, "shard")
    lock = hold(graph_lock_path(cfg.graph_dir), f"graph_dir '{cfg.graph_dir}'", "shard")
    with lock, metered() as meter:
        source = build_source(cfg.data)
        d = cfg.data
        writer = ShardWriter(
            cfg.graph_dir,
            name=source.name,
            num_nodes=source.num_nodes,
            feat_dim=source.feat_dim,
            num_classes=source.num_classes,
            nodes_per_shard=cfg.shard.nodes_per_shard,
            policy=EdgePolicy(d.make_undirected, d.self_loops, d.duplicate_edges),
            feat_dtype=source.feat_dtype,
            overwrite=cfg.overwrite,
            reorder=cfg.shard.reorder,
        )
        try:
            with make_progress() as bar:
                nodes = bar.add_task("nodes", total=source.num_nodes, extra="")
                for block in source.node_blocks():
                    writer.add_nodes(block.start, block.feat, block.label, block.split)
                    bar.advance(nodes, len(block.feat))
                edges = bar.add_task("edges", total=None, extra="")
                seen = 0
                for src, dst in source.edge_chunks():
                    writer.add_edges(src, dst)
                    seen += len(src)
                    bar.update(edges, advance=len(src), extra=f"{seen:,} read")
                bar.update(edges, total=seen, completed=seen)
                shards = bar.add_task("shards", total=writer.num_shards, extra="")
                meta = writer.finish(
                    split_fractions=d.split_fractions,
                    seed=cfg.seed,
                    use_source_split=d.use_source_split,
                    extra={
                        "source": {"kind": d.source, **source.describe()},
                        "source_fingerprint": source_fingerprint(cfg),
                    },
                    progress=lambda k, total: bar.update(shards, completed=k),
                )
        except BaseException:
            writer.abort()
            raise
        written = [(s["file"], s["sha256"]) for s in meta["shards"]] + order_files(meta)
        stamp_written(cfg.graph_dir, written)  # hashed as written
    summary = _summary(cfg, meta, meter)
    write_summary(run_dir, summary)
    summary_table(f"shard: {meta['name']} -> {cfg.graph_dir}", _rows(meta, summary))
    info(f"summary: {run_dir / 'summary.json'}")
    summary["run_dir"] = str(run_dir)
    return summary


def _summary(cfg: DictConfig, meta: dict, meter) -> dict:
    keys = ("name", "num_nodes", "num_edges", "input_edges", "feat_dim", "num_classes", "splits")
    return {
        "stage": "shard",
        "graph_dir": str(cfg.graph_dir),
        **{k: meta[k] for k in keys},
        "num_shards": len(meta["shards"]),
        "edges_per_s": round(meta["input_edges"] / max(meter.wall_s, 1e-9)),
        **meter.stats(),
    }


def _rows(meta: dict, summary: dict) -> dict:
    splits = meta["splits"]
    return {
        "nodes": meta["num_nodes"],
        "directed edges stored": meta["num_edges"],
        "avg in-degree": meta["num_edges"] / meta["num_nodes"],
        "features": f"{meta['feat_dim']} ({meta['feat_dtype']})",
        "classes": meta["num_classes"],
        "train / val / test": f"{splits['train']:,} / {splits['val']:,} / {splits['test']:,} ({splits['origin']})",
        "shards": len(meta["shards"]),
        "wall time (s)": summary["wall_time_s"],
        "peak anon memory (MB)": summary["peak_anon_mb"],
    }
