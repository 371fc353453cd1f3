"""Hard negatives for link prediction: friends of friends who are not yet partners.

Uniform negatives are almost never two hops from their source on a sparse graph, so they share no
neighbour with it: a decoder that reads common-neighbour counts learns "any shared neighbour means a
link" and never learns to order the pairs that do share some — which is the whole top of a
recommendation list, and where resource allocation beats it. A share of the negatives drawn as two-step
walks u -> w -> x (x not u, not already u's neighbour) puts exactly those pairs into training.

Walks run over the message-passing graph of the edge split (its CSC rows; build-csr writes each row
sorted, which the membership test below relies on), with torch's RNG: the same draws on every run of a
seed. A walk that dead-ends, returns to u or lands on a neighbour of u yields -1 (the caller draws a
uniform negative there instead).
"""

from __future__ import annotations

import numpy as np
import torch


class TwoHopNegatives:
    """x two steps from u, not u and not u's neighbour, for each source u (or -1)."""

    def __init__(self, indptr: np.ndarray, indices: np.ndarray):
        # int64 tensors for torch's gathers: a copy where the split stores int32 (8 B per edge while training)
        self.indptr = torch.from_numpy(np.asarray(indptr, dtype=np.int64))
        self.indices = torch.from_numpy(np.asarray(indices)).to(torch.int64)
        self.degree = self.indptr[1:] - self.indptr[:-1]
        self.last = max(len(self.indices) - 1, 0)  # gathers at a row's end are clamped here, then masked

    def _step(self, nodes: torch.Tensor) -> torch.Tensor:
        """One uniform neighbour of each node (-1 where the node has none)."""
        deg = self.degree[nodes]
        pick = (torch.rand(len(nodes), dtype=torch.float64) * deg).to(torch.int64)
        out = self.indices[(self.indptr[nodes] + pick).clamp(max=self.last)]
        return torch.where(deg > 0, out, torch.full_like(out, -1))

    def draw(self, src: torch.Tensor) -> torch.Tensor:
        src = src.to(torch.int64)
        if len(self.indices) == 0:
            return torch.full_like(src, -1)
        mid = self._step(src)
        far = self._step(mid.clamp(min=0))
        ok = (mid >= 0) & (far >= 0) & (far != src)
        ok &= ~self.linked(src, far.clamp(min=0))
        return torch.where(ok, far, torch.full_like(far, -1))

    def linked(self, u: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """Whether x[i] is in u[i]'s (sorted) row: a binary search per pair, all pairs at once."""
        lo, end = self.indptr[u], self.indptr[u + 1]
        hi = end.clone()
        while bool((lo < hi).any()):
            active = lo < hi
            mid = (lo + hi) // 2
            below = self.indices[mid.clamp(max=self.last)] < x
            lo = torch.where(active & below, mid + 1, lo)
            hi = torch.where(active & ~below, mid, hi)
        at = self.indices[lo.clamp(max=self.last)]
        return (lo < end) & (at == x)
