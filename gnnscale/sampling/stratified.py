"""`sampler.seed_order=stratified`: seed batches that each hold the training labels' class proportions.

Each class's seeds are shuffled and spread evenly over the epoch (the j-th of a class's n seeds sits at
position (j + u) / n, u a random offset per class); sorting by position interleaves the classes, so
every consecutive batch_size seeds hold each class in proportion, up to one seed. A plain shuffle gives
batches whose class mix varies by chance, which small batches on a skewed label set feel the most.
"""

from __future__ import annotations

from typing import Callable, Iterable

import numpy as np
import torch


def stratified_order(labels: np.ndarray, rng: np.random.RandomState) -> np.ndarray:
    """A permutation of range(len(labels)) whose every window holds the classes in proportion."""
    labels = np.asarray(labels)
    position = np.empty(len(labels), dtype=np.float64)
    for c in np.unique(labels):
        members = np.flatnonzero(labels == c)
        members = members[rng.permutation(len(members))]
        position[members] = (np.arange(len(members)) + rng.uniform()) / len(members)
    # Ties (equal positions from classes of equal size) are broken at random, not by class id.
    return np.lexsort((rng.permutation(len(labels)), position))


class StratifiedLoader:
    """Batches of `make_loader(ordered_seeds)` (an unshuffled loader), the order redrawn per iteration
    from numpy's global RNG (reseeded per epoch by the trainer, like DGL's own shuffle)."""

    def __init__(
        self,
        make_loader: Callable[[torch.Tensor], Iterable],
        seeds: torch.Tensor,
        labels: torch.Tensor,
        batch_size: int,
    ):
        self.make_loader, self.seeds, self.batch_size = make_loader, seeds, int(batch_size)
        self.labels = np.asarray(labels)

    def __len__(self) -> int:
        return -(-len(self.seeds) // self.batch_size)

    def __iter__(self):
        order = torch.from_numpy(stratified_order(self.labels, np.random.mtrand._rand))
        return iter(self.make_loader(self.seeds[order]))
