"""`sampler.seed_order=stratified`: seed batches that each hold the training labels' class proportions.

With the batch size known (as the loader knows it), batches are dealt: every full batch gets
floor(batch_size * share) seeds of each class, and the seeds left over are handed out one per batch
(a class never gets two extra in one batch), so each batch holds every class within one seed of its
proportion; the last, partial batch gets the rest in proportion. Which batches get a class's extra
seeds, which seeds of a class go where, and the order inside a batch are random.

Without a batch size each class's seeds are spread evenly over the epoch (the j-th of a class's n
seeds sits at position (j + u) / n, u a random offset per class) and sorting by position interleaves
the classes: any window of the order holds each class in proportion, within two seeds.

A plain shuffle gives batches whose class mix varies by chance, which small batches on a skewed label
set feel the most.
"""

from __future__ import annotations

from typing import Callable, Iterable

import numpy as np
import torch


def stratified_order(
    labels: np.ndarray, rng: np.random.RandomState, batch_size: int | None = None
) -> np.ndarray:
    """A permutation of range(len(labels)) whose batches (every batch_size seeds from the start) hold
    each class within one seed of its proportion; without batch_size, every window within two."""
    labels = np.asarray(labels)
    if batch_size is not None and len(labels):
        return _dealt(labels, rng, int(batch_size))
    position = np.empty(len(labels), dtype=np.float64)
    for c in np.unique(labels):
        members = np.flatnonzero(labels == c)
        members = members[rng.permutation(len(members))]
        position[members] = (np.arange(len(members)) + rng.uniform()) / len(members)
    # Ties (equal positions from classes of equal size) are broken at random, not by class id.
    return np.lexsort((rng.permutation(len(labels)), position))


def _apportion(total: int, share: np.ndarray, rng: np.random.RandomState) -> np.ndarray:
    """Integer counts summing to total, each floor or ceil of total * share (largest remainders first,
    ties at random)."""
    exact = total * share
    counts = np.floor(exact).astype(np.int64)
    left = total - int(counts.sum())
    if left > 0:
        rank = np.lexsort((rng.permutation(len(share)), -(exact - counts)))
        counts[rank[:left]] += 1
    return counts


def _dealt(labels: np.ndarray, rng: np.random.RandomState, batch_size: int) -> np.ndarray:
    classes, y = np.unique(labels, return_inverse=True)
    n = np.bincount(y, minlength=len(classes))
    share = n / len(labels)
    full, rest = divmod(len(labels), batch_size)
    last = _apportion(rest, share, rng) if rest else np.zeros(len(classes), np.int64)
    in_full = n - last  # within one seed of full * batch_size * share: full batches can hold it
    base = np.floor(batch_size * share).astype(np.int64)
    extra = in_full - full * base  # 0..full extra seeds per class, one to a batch
    assert full == 0 or (extra.min() >= 0 and extra.max() <= full), "stratified deal out of bounds"
    counts = np.tile(base, (max(full, 1), 1)) if full else np.zeros((0, len(classes)), np.int64)
    if full:
        # Deal the extra seeds class by class, batch after batch: a class's extras (<= full of them)
        # land in different batches, and every batch gets the same number of extras.
        order = rng.permutation(len(classes))
        owners = np.repeat(order, extra[order])
        slots = rng.permutation(full)[np.arange(len(owners)) % full]
        np.add.at(counts, (slots, owners), 1)
    if rest:
        counts = np.vstack([counts, last])
    # Seeds grouped by class, shuffled within it; a class's seeds fill its places batch after batch.
    perm = rng.permutation(len(y))
    grouped = perm[np.argsort(y[perm], kind="stable")]
    batch_of = np.empty(len(y), np.int64)
    batch_of[grouped] = np.concatenate(
        [np.repeat(np.arange(len(counts)), counts[:, c]) for c in range(len(classes))]
    )
    return np.lexsort((rng.permutation(len(y)), batch_of))  # by batch; at random within it


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
        order = torch.from_numpy(stratified_order(self.labels, np.random.mtrand._rand, self.batch_size))
        return iter(self.make_loader(self.seeds[order]))
