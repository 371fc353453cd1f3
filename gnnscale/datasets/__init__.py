"""Graph sources (`data=`): each streams a raw format into the shard writer."""

from __future__ import annotations

from omegaconf import OmegaConf

from gnnscale.datasets.base import NodeBlock, Source
from gnnscale.errors import ConfigError
from gnnscale.storage.run_dir import config_hash


def build_source(data_cfg) -> Source:
    """Factory: `data.source` -> a Source."""
    kind = data_cfg.source
    if kind == "synthetic":
        from gnnscale.datasets.synthetic import SyntheticSource

        return SyntheticSource(data_cfg)
    if kind == "planetoid":
        from gnnscale.datasets.planetoid import PlanetoidSource

        return PlanetoidSource(data_cfg)
    if kind == "npz":
        from gnnscale.datasets.npz import NpzSource

        return NpzSource(data_cfg)
    if kind == "edgelist":
        from gnnscale.datasets.edgelist import EdgelistSource

        return EdgelistSource(data_cfg)
    if kind == "dgl":
        from gnnscale.datasets.dgl_bin import DglSource

        return DglSource(data_cfg)
    if kind == "ogb":
        from gnnscale.datasets.ogb import OgbSource

        return OgbSource(data_cfg)
    raise ConfigError(f"unknown data source '{kind}'", "choose data=synthetic|planetoid|npz|edgelist|dgl|ogb")


def source_fingerprint(cfg) -> str:
    """What determines a graph_dir's content: the data config, the shard size and the node order."""
    key = {
        "data": OmegaConf.to_container(cfg.data, resolve=True),
        "nodes_per_shard": cfg.shard.nodes_per_shard,
    }
    reorder = cfg.shard.get("reorder", "none")
    if reorder != "none":  # only then: graph_dirs sharded before shard.reorder existed stay up to date
        key["reorder"] = reorder
    return config_hash(key)


__all__ = ["build_source", "source_fingerprint", "Source", "NodeBlock"]
