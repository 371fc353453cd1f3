"""On Cora: layer-wise inference equals the full-graph forward, and its test accuracy is not below sampled evaluation."""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import build_graph, shared_data
from tests.test_infer_support import infer, make_ckpt, reference_layers


@pytest.fixture(scope="module")
def cora(tmp_path_factory):
    path = shared_data("planetoid_cora")
    return build_graph(tmp_path_factory.mktemp("cora"), "data=planetoid", f"data.path={path}")


def test_cora_layerwise_exact_and_accurate(tmp_path, cora):
    # Full-graph training is enough here; what is checked is inference of a fixed checkpoint.
    ckpt = make_ckpt(tmp_path / "train", cora, hidden=64, num_layers=2, norm="none", dropout=0.5, steps=60)
    lw = infer(tmp_path, "lw", f"ckpt={ckpt}")
    ref = reference_layers(ckpt, cora)
    assert np.abs(np.load(tmp_path / "lw" / "embeddings.npy") - ref[0]).max() < 1e-4
    assert np.abs(np.load(tmp_path / "lw" / "layers" / "h_2.npy") - ref[1]).max() < 1e-4
    sampled = infer(
        tmp_path, "sp", f"ckpt={ckpt}", "infer.mode=sampled", "infer.fanouts=[10,10]", "infer.nodes=test"
    )
    assert lw["metric"]["labelled_nodes"] == sampled["metric"]["labelled_nodes"] == 1000
    assert lw["test_acc"] > 0.7
    assert lw["test_acc"] >= sampled["test_acc"] - 0.01
