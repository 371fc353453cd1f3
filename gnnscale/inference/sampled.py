"""Sampled mini-batch inference for a subset of nodes: fast for a few nodes, approximate (fanouts)."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

from gnnscale.errors import ConfigError, DataError
from gnnscale.inference.job import input_features
from gnnscale.inference.outputs import accuracy, emb_info, write_emb_info, write_predictions
from gnnscale.sampling import set_sampling_threads
from gnnscale.sampling.graph import to_dgl_graph
from gnnscale.storage.graph_dir import GraphDir
from gnnscale.storage.run_dir import EMBEDDINGS, PREDICTIONS
from gnnscale.utils.atomic import atomic_path
from gnnscale.utils.ui import info, make_progress

SPLITS = ("train", "val", "test")


def resolve_nodes(spec: str, graph: GraphDir) -> tuple[np.ndarray, str]:
    """infer.nodes: a split name, 'all', or a .npy of node ids -> (the user's ids, description).

    The user's ids: those of the source graph, also for a graph_dir sharded with shard.reorder (map them
    with graph.node_order.to_graph); a split's nodes come in the user's id order."""
    n = graph.num_nodes
    if spec in SPLITS:
        ids = graph.node_order.to_user(graph.split_ids(spec).numpy().astype(np.int64))
        return np.sort(ids), f"the {spec} split"
    if spec == "all":
        return np.arange(n, dtype=np.int64), "all nodes"
    path = Path(spec)
    if not path.is_file():
        raise ConfigError(
            f"infer.nodes={spec!r} is neither a split nor a file",
            "use infer.nodes=train|val|test|all or infer.nodes=FILE.npy",
        )
    try:
        ids = np.load(path, allow_pickle=False)
    except Exception as exc:
        raise DataError(
            f"cannot read {path}: {str(exc).splitlines()[0]}", "infer.nodes must be a .npy of node ids"
        ) from None
    if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer):
        raise DataError(
            f"{path} holds {ids.dtype} {ids.shape}, expected a 1-D integer array",
            "save node ids with numpy.save(path, ids.astype('int64'))",
        )
    if len(ids) == 0:
        raise DataError(f"{path} lists no node", "give at least one node id")
    if ids.min() < 0 or ids.max() >= n:
        bad = int(ids.min() if ids.min() < 0 else ids.max())
        raise DataError(f"{path} holds node id {bad} outside [0, {n})", "node ids are those of the graph_dir")
    return ids.astype(np.int64), f"{len(ids):,} nodes from {path}"


def resolve_fanouts(fanouts, num_layers: int) -> list[int]:
    fanouts = [int(f) for f in (fanouts or [10] * num_layers)]
    if len(fanouts) != num_layers:
        raise ConfigError(
            f"infer.fanouts has {len(fanouts)} entries but the model has {num_layers} layers",
            f"give one per layer, e.g. infer.fanouts=[{','.join(['10'] * num_layers)}]",
        )
    if any(f == 0 or f < -1 for f in fanouts):
        raise ConfigError(
            f"infer.fanouts={fanouts} must be positive or -1 (all neighbours)", "e.g. infer.fanouts=[10,10]"
        )
    return fanouts


def sampled_infer(
    model,
    g,
    features,
    nodes: np.ndarray,
    fanouts: list[int],
    emb_layer: int,
    batch_size: int,
    seed: int,
    device=torch.device("cpu"),
    progress=None,
):
    """(embeddings [len(nodes), d], logits [len(nodes), C]) with rows in the order of `nodes`."""
    import dgl

    from gnnscale.sampling.neighbor import NeighborBlockSampler

    # The training sampler: the same draws, and the same blocks for the same seed in any process.
    sampler = NeighborBlockSampler(fanouts)
    dgl.seed(seed)
    torch.manual_seed(seed)
    # Sample each distinct node once (in id order, so gathers read forward) and map rows back to `nodes`.
    uniq, inv = np.unique(nodes, return_inverse=True)
    emb = np.empty((len(uniq), model.dims[emb_layer]), dtype=np.float32)
    logits = np.empty((len(uniq), model.dims[-1]), dtype=np.float32)
    with torch.no_grad():
        for lo in range(0, len(uniq), batch_size):
            seeds = torch.from_numpy(uniq[lo : lo + batch_size])
            input_nodes, _, blocks = sampler.sample_blocks(g, seeds)
            h = features.gather(input_nodes).to(torch.float32).to(device)
            for layer, block in enumerate(blocks):
                h = model.layer_forward(layer, block.to(device), h)
                if layer + 1 == emb_layer:
                    # A block's destinations start with the seeds (DGL's block convention), at every layer.
                    emb[lo : lo + len(seeds)] = h[: len(seeds)].cpu().numpy()
            logits[lo : lo + len(seeds)] = h.cpu().numpy()
            if progress is not None:
                progress(min(lo + batch_size, len(uniq)), len(uniq))
    return emb[inv], logits[inv]


def run_sampled(ck, graph: GraphDir, layer: int, run_dir: Path, opts, seed: int, device) -> dict:
    """The sampled inference of opts.nodes into run_dir; returns the stage's summary fields."""
    user_ids, what = resolve_nodes(opts.nodes, graph)
    nodes = graph.node_order.to_graph(user_ids)  # what is sampled and gathered: graph_dir's ids
    fanouts = resolve_fanouts(list(opts.fanouts), ck.num_layers)
    info(f"sampled inference for {what} ({len(nodes):,}), fanouts {fanouts}")
    model = ck.model.to(device)
    set_sampling_threads(torch.get_num_threads())  # seeded draws that repeat in any process
    g = to_dgl_graph(graph)
    t0 = time.time()
    with make_progress() as bar:
        task = bar.add_task("sampled batches", total=len(nodes), extra="")
        emb, logits = sampled_infer(
            model,
            g,
            input_features(graph, ck, g.adj_tensors("csc")[0]),
            nodes,
            fanouts,
            layer,
            opts.batch_size,
            seed,
            device,
            progress=lambda d, t: bar.update(task, completed=d),
        )
    compute_s = time.time() - t0
    t1 = time.time()
    for name, arr in (("node_ids.npy", user_ids), (EMBEDDINGS, emb)):
        with atomic_path(run_dir / name) as tmp, open(tmp, "wb") as fh:
            np.save(fh, arr)
    files, metric = {}, None  # task=link: the last layer is the embedding, there are no classes
    if ck.task != "link":
        files = write_predictions(logits, run_dir, opts.probabilities)
        split = opts.nodes if opts.nodes in SPLITS else "all"
        metric = accuracy(np.load(run_dir / PREDICTIONS), graph, split, nodes)
    node_order = "row i is global node id node_ids.npy[i]"
    if not graph.node_order.identity:
        node_order += f" (the user's ids; graph_dir is reordered by {graph.node_order.method}, mapped back)"
    write_emb_info(
        run_dir,
        emb_info(emb, layer, ck, graph, "sampled", node_order, fanouts=fanouts, seed=seed, cache=None),
    )
    return {
        "stage": "infer",
        "mode": "sampled",
        "ckpt": str(ck.path),
        "graph_dir": str(graph.path),
        "num_nodes": int(len(nodes)),
        "nodes": what,
        "num_layers": ck.num_layers,
        "fanouts": fanouts,
        "batch_size": int(opts.batch_size),
        "infer_time_s": round(compute_s, 3),
        "nodes_per_s": round(len(nodes) / max(compute_s, 1e-9)),
        "publish_time_s": round(time.time() - t1, 3),
        "embeddings": {"shape": list(emb.shape), "layer": layer},
        "files": {"node_ids": "node_ids.npy", "embeddings": EMBEDDINGS, **files},
        "metric": metric,
        "test_acc": metric["accuracy"] if metric and metric["split"] == "test" else None,
    }
