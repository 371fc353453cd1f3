"""The hot-feature cache's hit rate per epoch (metrics.jsonl) and over the run (summary.json).

Only training batches count: the counters are read at each training batch's end, so the last reading
of an epoch is taken before validation (and the diagnostics' probe) gather anything. With prefetch a
reading includes batches gathered ahead; the epoch's last one includes all of them and none of the next.
"""

from __future__ import annotations

from gnnscale.storage.feature_store import FeatureStore
from gnnscale.training.loop import BatchEnd
from gnnscale.training.trainer import Callback


def _rate(hits: int, misses: int) -> float | None:
    return round(hits / (hits + misses), 4) if hits + misses else None


class CacheHitRate(Callback):
    def __init__(self, features: FeatureStore):
        self.features = features
        self._start = self._last = (0, 0)
        self.hits = self.misses = 0  # training gathers over the whole run (this process)

    def on_epoch_start(self, epoch: int, num_batches: int) -> None:
        self._start = self._last = self.features.cache_counts()

    def on_batch_end(self, epoch: int, end: BatchEnd) -> None:
        self._last = self.features.cache_counts()

    def on_epoch_record(self, epoch: int, record: dict, model) -> None:
        hits, misses = self._last[0] - self._start[0], self._last[1] - self._start[1]
        self.hits, self.misses = self.hits + hits, self.misses + misses
        record.update({"cache_hit_rate": _rate(hits, misses), "cache_hits": hits, "cache_misses": misses})

    def summary(self) -> dict:
        """summary.json's `hot_feature_cache`: size and the training gathers' hit rate."""
        return {
            "rows": self.features.cache_rows,
            "fraction_of_nodes": round(self.features.cache_rows / max(self.features.num_nodes, 1), 4),
            "mb": round(self.features.cache_bytes / 2**20, 1),
            "hit_rate": _rate(self.hits, self.misses),
            "hits": self.hits,
            "misses": self.misses,
        }
