"""Read a graph_dir: meta, shards (mmap, weights_only), labels and split masks (checksums: storage/verify.py)."""

from __future__ import annotations

from functools import cached_property
from pathlib import Path

import numpy as np
import torch

from gnnscale.errors import GraphDirError
from gnnscale.storage.meta import read_meta
from gnnscale.storage.node_order import NodeOrder, load_node_order

SHARD_KEYS = ("feat", "label", "train_mask", "val_mask", "test_mask", "src", "dst")


def load_shard_file(path: str | Path) -> dict:
    """Open one shard lazily: tensors are mmap'd, and weights_only means a shard cannot run code."""
    path = Path(path)
    if not path.is_file():
        raise GraphDirError(f"shard {path} is missing", "re-run `gnnscale shard` with overwrite=true")
    try:
        data = torch.load(str(path), mmap=True, weights_only=True, map_location="cpu")
    except Exception as exc:
        raise GraphDirError(
            f"cannot read shard {path}: {str(exc).splitlines()[0]}",
            "re-run `gnnscale shard` with overwrite=true",
        ) from None
    missing = [k for k in SHARD_KEYS if k not in data]
    if missing:
        raise GraphDirError(
            f"shard {path} lacks {', '.join(missing)}", "re-run `gnnscale shard` with overwrite=true"
        )
    return data


class GraphDir:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.meta = read_meta(self.path)
        self._shards: dict[int, dict] = {}

    @property
    def num_nodes(self) -> int:
        return int(self.meta["num_nodes"])

    @property
    def num_shards(self) -> int:
        return len(self.meta["shards"])

    @cached_property
    def node_order(self) -> NodeOrder:
        """The map between the user's node IDs and this graph_dir's (identity unless shard.reorder)."""
        return load_node_order(self.path, self.meta)

    @cached_property
    def node_starts(self) -> np.ndarray:
        """Shard boundaries [s_0=0, s_1, ..., N]: shard i owns [starts[i], starts[i+1])."""
        shards = self.meta["shards"]
        return np.array([s["node_start"] for s in shards] + [shards[-1]["node_end"]], dtype=np.int64)

    def shard(self, i: int) -> dict:
        if i not in self._shards:
            self._shards[i] = load_shard_file(self.path / self.meta["shards"][i]["file"])
        return self._shards[i]

    def _concat(self, key: str) -> torch.Tensor:
        return torch.cat([self.shard(i)[key] for i in range(self.num_shards)])

    def labels(self) -> torch.Tensor:
        return self._concat("label")

    def mask(self, split: str) -> torch.Tensor:
        return self._concat(f"{split}_mask")

    def split_ids(self, split: str) -> torch.Tensor:
        return torch.nonzero(self.mask(split), as_tuple=True)[0]

    @property
    def has_csc(self) -> bool:
        return "csc" in self.meta
