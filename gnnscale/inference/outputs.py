"""What an infer run publishes: embeddings.npy, predictions.npy, probabilities.npy, emb_info.json, metrics."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import torch

from gnnscale.storage.graph_dir import GraphDir
from gnnscale.storage.run_dir import EMB_INFO, EMBEDDINGS, config_hash
from gnnscale.utils.atomic import atomic_path, fsync_dir, write_json

_CHUNK = 1 << 16


def fsync_file(path: Path) -> None:
    with open(path, "rb+") as fh:
        os.fsync(fh.fileno())


def publish(partial: Path, final: Path) -> None:
    """fsync + rename: a half-written layer file is never mistaken for a finished one."""
    fsync_file(partial)
    os.replace(partial, final)


def link_or_copy(src: Path, dst: Path) -> str:
    """embeddings.npy is one of the layer files: a hard link costs no space or time where allowed."""
    if dst.exists():
        dst.unlink()
    try:
        os.link(src, dst)
        return "hardlink"
    except OSError:
        with atomic_path(dst) as tmp:
            shutil.copyfile(src, tmp)
        return "copy"


def _chunk(arr: np.ndarray, lo: int, rows: np.ndarray | None) -> np.ndarray:
    """Output rows [lo, lo + _CHUNK): arr's own rows, or arr[rows[...]] (a reordered graph_dir's rows
    taken in the user's node order: rows = node_order.old_to_new)."""
    if rows is None:
        return arr[lo : lo + _CHUNK]
    return np.asarray(arr[np.asarray(rows[lo : lo + _CHUNK])])


def write_rows(src: Path, dst: Path, rows: np.ndarray) -> None:
    """dst[i] = src[rows[i]], streamed by chunk: a layer file of a reordered graph_dir in the user's order."""
    arr = np.load(src, mmap_mode="r")
    with atomic_path(dst) as tmp:
        out = np.lib.format.open_memmap(tmp, mode="w+", dtype=arr.dtype, shape=(len(rows),) + arr.shape[1:])
        for lo in range(0, len(rows), _CHUNK):
            out[lo : lo + _CHUNK] = _chunk(arr, lo, rows)
        out.flush()
        del out


def write_predictions(
    logits: np.ndarray, run_dir: Path, probabilities: bool, rows: np.ndarray | None = None
) -> dict:
    """predictions.npy (int64 class ids) and optionally probabilities.npy (softmax), streamed by chunk.

    rows: output row i is logits[rows[i]] (a reordered graph_dir: node_order.old_to_new)."""
    n = logits.shape[0] if rows is None else len(rows)
    c = logits.shape[1]
    files = {"predictions": "predictions.npy"}
    with atomic_path(run_dir / "predictions.npy") as tmp:
        pred = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.int64, shape=(n,))
        for lo in range(0, n, _CHUNK):
            pred[lo : lo + _CHUNK] = np.argmax(_chunk(logits, lo, rows), axis=1)
        pred.flush()
        del pred
    if probabilities:
        with atomic_path(run_dir / "probabilities.npy") as tmp:
            prob = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.float32, shape=(n, c))
            for lo in range(0, n, _CHUNK):
                prob[lo : lo + _CHUNK] = torch.softmax(
                    torch.from_numpy(np.asarray(_chunk(logits, lo, rows), dtype=np.float32)), dim=1
                ).numpy()
            prob.flush()
            del prob
        files["probabilities"] = "probabilities.npy"
    fsync_dir(run_dir)
    return files


def accuracy(
    pred: np.ndarray, graph: GraphDir, split: str, node_ids: np.ndarray | None = None
) -> dict | None:
    """Accuracy over the split's labelled nodes (node_ids: the rows of `pred`, default every node)."""
    if split not in ("train", "val", "test", "all"):
        return None
    labels = graph.labels().numpy()
    member = np.ones(graph.num_nodes, dtype=bool) if split == "all" else graph.mask(split).numpy()
    ids = np.arange(graph.num_nodes) if node_ids is None else node_ids
    keep = member[ids] & (labels[ids] >= 0)
    if not keep.any():
        return None
    correct = np.asarray(pred)[keep] == labels[ids[keep]]
    return {"split": split, "accuracy": round(float(correct.mean()), 6), "labelled_nodes": int(keep.sum())}


def _layer_kind(layer: int, ck) -> str:
    if layer < ck.num_layers:
        return f"hidden (input of layer {layer + 1})"
    return "link embedding (the pair decoder's input)" if ck.task == "link" else "logits"


def emb_info(emb: np.ndarray, layer: int, ck, graph: GraphDir, mode: str, node_order: str, **extra) -> dict:
    """What embeddings.npy holds and what produced it: the one place emb_info.json is assembled."""
    return {
        "file": EMBEDDINGS,
        "shape": list(emb.shape),
        "dtype": str(emb.dtype),
        "layer": layer,
        "num_layers": ck.num_layers,
        "layer_kind": _layer_kind(layer, ck),
        "task": ck.task,
        # decoder=mlp: top-K by inner product (gnnscale recommend) is not the score the model was trained on
        **({"decoder": ck.decoder} if ck.task == "link" else {}),
        "node_order": node_order,
        "mode": mode,
        "graph_dir": str(graph.path.resolve()),
        "graph_name": graph.meta["name"],
        "graph_shards_sha256": [s["sha256"] for s in graph.meta["shards"]],
        "ckpt": str(ck.path.resolve()),
        "signature_hash": ck.signature_hash,
        "weights_hash": ck.weights_hash,
        "model_cfg": ck.model_cfg,
        "model_cfg_hash": config_hash(ck.model_cfg),
        **extra,
    }


def write_emb_info(run_dir: Path, record: dict) -> None:
    """Written last: its presence marks a complete infer run."""
    write_json(run_dir / EMB_INFO, record)
