"""model.degree_feature: every input row ends in log1p(in-degree) — in mmap'd, in-RAM and cached gathers,
counted over the message-passing graph in training and over every edge in inference — and a link model's
embeddings are its last layer's output (what the pair decoder scored), decoder=mlp included."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gnnscale.config import compose_config
from gnnscale.models.checkpoint import load_model
from gnnscale.sampling.graph import csc_to_dgl
from gnnscale.stages import infer, train
from gnnscale.storage.csc import open_csc
from gnnscale.storage.feature_store import FeatureStore
from gnnscale.storage.graph_dir import GraphDir
from gnnscale.storage.run_dir import find_checkpoint


def expected_rows(g: GraphDir, indptr, ids: torch.Tensor) -> torch.Tensor:
    stored = FeatureStore(g, in_memory=True).gather(ids)
    logdeg = torch.from_numpy(np.log1p(np.diff(np.asarray(indptr)).astype(np.float32)))
    return torch.cat([stored, logdeg[ids, None]], dim=1)


@pytest.mark.parametrize("how", ["mmap", "memory", "cached"])
def test_every_gather_ends_in_the_log_degree(tiny_graph, how):
    g = GraphDir(tiny_graph)  # 3 shards: rows come from several files
    indptr, _ = open_csc(g)
    store = FeatureStore(g, in_memory=how == "memory", degree_indptr=indptr)
    if how == "cached":
        assert store.cache_hottest(100, indptr) == 100
    ids = torch.from_numpy(np.random.default_rng(0).integers(0, g.num_nodes, 500))
    assert store.feat_dim == int(g.meta["feat_dim"]) + 1
    want = expected_rows(g, indptr, ids)
    assert torch.equal(store.gather(ids), want)
    out = torch.empty_like(want)
    store.gather(ids, out=out)  # the training path's reused buffer
    assert torch.equal(out, want)
    if how == "cached":
        assert store.hits > 0 and store.misses > 0


def _train_link(graph, tmp_path, *extra) -> dict:
    cfg = compose_config(
        "train",
        [
            f"graph_dir={graph}",
            f"run_dir={tmp_path / 'train'}",
            "task=link",
            "model.hidden=16",
            "model.degree_feature=true",
            "model.aggregator=mean",
            "train.epochs=1",
            "train.batch_size=256",
            "task.eval_negatives=50",
            *extra,
        ],
    )
    return train.run(cfg)


@pytest.mark.parametrize("decoder", ["dot", "mlp"])
def test_link_embeddings_are_the_last_layer_over_features_with_the_full_graph_degree(
    tiny_graph, tmp_path, decoder
):
    run = _train_link(tiny_graph, tmp_path, f"task.decoder={decoder}")
    infer.run(
        compose_config(
            "infer", [f"ckpt={run['run_dir']}", f"graph_dir={tiny_graph}", f"run_dir={tmp_path / 'infer'}"]
        )
    )
    emb = np.load(tmp_path / "infer" / "embeddings.npy")
    ck = load_model(find_checkpoint(run["run_dir"]))
    assert ck.degree_feature and ck.decoder == decoder and ck.in_dim == 9
    g = GraphDir(tiny_graph)
    indptr, indices = open_csc(g)
    # int32 indices with an int64 indptr: DGL wants one idtype, which csc_to_dgl gives it
    full = csc_to_dgl(indptr, indices, g.num_nodes).formats(["csc", "csr", "coo"])
    x = expected_rows(g, indptr, torch.arange(g.num_nodes))
    with torch.no_grad():
        want = ck.model([full] * ck.num_layers, x).numpy()  # every layer over every in-edge
    assert emb.shape == (g.num_nodes, 16)
    np.testing.assert_allclose(emb, want, rtol=1e-4, atol=1e-4)


def test_a_node_model_with_the_degree_column_trains_and_infers(tiny_graph, tmp_path):
    cfg = compose_config(
        "train",
        [
            f"graph_dir={tiny_graph}",
            f"run_dir={tmp_path / 'train'}",
            "model.hidden=16",
            "model.degree_feature=true",
            "train.epochs=1",
            "train.feature_cache=memory",
        ],
    )
    run = train.run(cfg)
    out = infer.run(
        compose_config(
            "infer", [f"ckpt={run['run_dir']}", f"graph_dir={tiny_graph}", f"run_dir={tmp_path / 'infer'}"]
        )
    )
    preds = np.load(tmp_path / "infer" / "predictions.npy")
    assert preds.shape == (600,) and out["mode"] == "layerwise"
