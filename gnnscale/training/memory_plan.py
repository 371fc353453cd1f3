"""What a train run will hold in memory, estimated before the first batch, and the settings that fit.

The estimate starts from what the process holds now (interpreter, torch, DGL, labels and splits:
measured, not guessed) and adds what training will allocate, from the sizes of a few sampled
batches: the feature matrix when it is held in RAM, the gather buffers (one per prefetched batch),
one training step's blocks, activations and gradients (or one evaluation batch's, whichever is
larger), the optimizer's state and the trainer's own overhead (a measured constant). Memory-mapped files
(the CSC, features read from the shards) show up in RSS too, but the kernel can reclaim them: they
are counted in `rss`; what must fit counts the CSC, which sampling reads all over, and, for
memory-mapped features, the pages one training batch reads (below that the kernel evicts pages the
next batch needs, and every batch goes back to disk).

Features that do not fit in RAM are read by a sweep over the feature file (feature_cache=read,
training/sweep.py): the sweep's pool of rows held for the batches in flight (a row once however many
need it, with its slot's index entries) and its node -> slot map, the sweep's two chunk buffers (and the
reader's own where it reads sparse rows) and the blocks of the batches sampled ahead; the rows get what
the budget leaves (STAGE_SHARE of it), which sets how many batches share a pass over the disk. The
graph structure is held in RAM when it fits beside the rest (the sampler then never faults), else
memory-mapped. Where the model's first layer sums before it projects (Sizes.first_sums, training/sum_sweep.py)
no input rows are held at all: the sweep's pool, node map and gather buffers give way to the pass's buffers
and two cohorts of first-layer sums, which get what the budget leaves (STAGE_SHARE of it); the cohort size
sets how many batches share a pass.

A hot-feature cache (train.cache_gb, memory-mapped or read features) is anonymous memory: its rows and a
4-byte node -> slot map. It gets what the budget has left once features and prefetch are settled, up
to what was asked: a cache that does not fit is shrunk (said in one line), never a reason to refuse a
run that fits without it. The pages one batch reads through the mmap are still counted in full
(conservative: cache hits read no pages, but how many hit depends on the batch).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

import numpy as np
import torch

from gnnscale.storage.feature_store import FeatureStore
from gnnscale.training.sum_sweep import CHUNK_BYTES as SUMS_CHUNK_BYTES
from gnnscale.training.sum_sweep import PASS_BYTES, batches_a_pass, shape_bytes
from gnnscale.training.sweep import CHUNK_BYTES as SWEEP_CHUNK_BYTES
from gnnscale.training.sweep import SLOT_INDEX_BYTES, node_map_bytes, reads_dense
from gnnscale.utils.memlimit import Budget, gb
from gnnscale.utils.memory import rss_anon_mb, rss_mb

BYTES = 4  # float32 activations, gathered rows and parameters
# Extra memory of a running trainer the parts below do not list: the autograd engine and its thread
# pools, the optimizer's and scheduler's bookkeeping, the health diagnostics, checkpoint writes. Measured
# as peak RssAnon of `gnnscale train` minus the other parts on a 600-node graph, where nothing else is large
# (2 cores; 48 MB with sage_2hop and with full_gcn).
TRAINER_OVERHEAD = 48 << 20
# The heap's slack over the per-batch tensors (freed ones held by glibc's per-thread arenas until reused), as
# a share of them: the capped 200k-node CI test (tests/test_memory_budget.py) peaked at 991-1036 MB against
# 1025 MB planned without it (7 runs; CI's run was the 1036), and at 974-1002 MB against 1030 MB with it
# (4 runs). The plan's other parts are one-off allocations.
ALLOCATOR_SLACK = 0.15
TRANSIENT_PARTS = ("gather buffers", "batch working set", "blocks in flight")
# The feature reader's own read buffers (storage/feature_reader.FeatureReader's buffer_bytes default):
# used by sparse reads only (a sweep that reads its chunks whole reads them into its own buffers).
READ_BUFFERS = 64 << 20
# Of what the budget leaves once everything else is counted, the share the rows read ahead take: the rest
# stays for the page cache of the program's own files and the heap's slack.
STAGE_SHARE = 0.9
# At most this many batches in flight on the sweep: past that only the held blocks grow.
MAX_STAGE_BATCHES = 64
# The sweep's own buffers: two chunks (one read while the other is copied into its pool).
SWEEP_BUFFERS = 2 * SWEEP_CHUNK_BYTES
LEAN_FEATURES = "read"  # the placement of the leanest plan: features read ahead into small buffers


@dataclass(frozen=True)
class BatchShape:
    """The largest of a few sampled batches: rows gathered, and per layer (input first) dst rows and edges."""

    input_rows: int
    dst_rows: tuple[int, ...]
    edges: tuple[int, ...]

    def scaled(self, factor: float, num_nodes: int) -> "BatchShape":
        """A batch `factor` times as large (linear: an upper bound, neighbourhoods overlap more)."""
        return BatchShape(
            min(int(self.input_rows * factor) + 1, num_nodes),
            tuple(min(int(d * factor) + 1, num_nodes) for d in self.dst_rows),
            tuple(int(e * factor) + 1 for e in self.edges),
        )


def probe_batches(
    g, ids: torch.Tensor, sampler, batch_size: int, k: int = 3, num_layers: int = 0
) -> BatchShape:
    """Sample k batches of `ids` (the first k of a fixed random order) and keep the largest sizes.
    A formation with its own loader (subgraphs) gives its first k batches; each of its num_layers
    layers runs on the whole subgraph."""
    order = torch.from_numpy(np.random.default_rng(0).permutation(len(ids)))
    shapes = []
    own = getattr(sampler, "loader", None)
    if own is not None:
        for b in itertools.islice(own(g, ids[order], batch_size, False, 0, False), k):
            layers = b.layers(max(num_layers, 1))
            shapes.append(
                (len(b.input_nodes), [s.num_nodes() for s in layers], [s.num_edges() for s in layers])
            )
    for j in range(min(k, max(1, -(-len(ids) // batch_size))) if own is None else 0):
        seeds = ids[order[j * batch_size : (j + 1) * batch_size]]
        input_nodes, _, blocks = sampler.sample_blocks(g, seeds)
        shapes.append(
            (len(input_nodes), [b.num_dst_nodes() for b in blocks], [b.num_edges() for b in blocks])
        )
    return BatchShape(
        max(s[0] for s in shapes),
        tuple(max(s[1][i] for s in shapes) for i in range(len(shapes[0][1]))),
        tuple(max(s[2][i] for s in shapes) for i in range(len(shapes[0][2]))),
    )


@dataclass(frozen=True)
class Sizes:
    """What the plan needs to know about the graph and the model (no tensors)."""

    num_nodes: int
    feat_dim: int
    feat_itemsize: int
    csc_bytes: int
    dims: tuple[int, ...]  # in_dim, hidden..., num_classes
    num_params: int
    input_dropout: bool
    # read from disk, the training and evaluation batches' first layer is summed as the file is read
    # (training/sum_sweep.py; training.build.sums_first_layer decides)
    first_sums: bool = False
    norm: bool = False  # a norm layer (batch / layer) after each hidden layer

    @property
    def feature_bytes(self) -> int:
        return self.num_nodes * self.feat_dim * self.feat_itemsize

    @property
    def row_bytes(self) -> int:
        return self.feat_dim * self.feat_itemsize


@dataclass(frozen=True)
class Workload:
    """What a plan is made from: the sizes, the largest sampled training and evaluation batches, and what
    the process holds now (read once: every candidate plan starts from the same reading)."""

    sizes: Sizes
    train: BatchShape
    evals: BatchShape
    anon_now: int  # bytes of anonymous memory
    mapped_now: int  # bytes of RSS beyond that: mapped pages already touched

    @classmethod
    def now(cls, sizes: Sizes, train: BatchShape, evals: BatchShape) -> "Workload":
        anon, rss = (rss_anon_mb() or 0.0) * 2**20, (rss_mb() or 0.0) * 2**20
        return cls(sizes, train, evals, int(anon), int(max(rss - anon, 0)))

    def scaled(self, train_factor: float, eval_factor: float) -> "Workload":
        """Batches this many times as large (the sampled sizes when a factor is 1)."""
        n = self.sizes.num_nodes
        train = self.train.scaled(train_factor, n) if train_factor < 1 else self.train
        return replace(self, train=train, evals=self.evals.scaled(eval_factor, n))


@dataclass(frozen=True)
class MemoryPlan:
    feature_cache: str  # memory | mmap
    prefetch: int
    parts: dict  # name -> bytes
    must_fit: int  # anonymous memory plus the CSC: what a limit must hold for training to run
    rss: int  # what peak RSS should read (mapped files included)
    budget: Budget
    cache_rows: int = 0  # rows of the hot-feature cache (0 = none)
    feature_bytes: int = 0  # the whole feature matrix
    eval_batch_size: int = 0  # seeds per evaluation batch, when the plan settled it (0 = not settled here)
    structure: str = "mmap"  # memory | mmap: where the graph structure (CSC) is read from
    stage_rows: int = 0  # feature_cache=read: rows the batches in flight may hold in all
    stage_batches: int = 0  # feature_cache=read: the most batches in flight on the sweep
    # of stage_rows, what the oldest batch may take past the sweep's cap (it always completes): one batch's
    # rows. Measured without it, peak heap passed the plan by a third to a half of a batch's rows.
    stage_reserve: int = 0
    sums_bytes: int = 0  # first-layer sums (Sizes.first_sums): what two cohorts of batches may hold

    @property
    def sweep_cap(self) -> int:
        """Rows the sweep lets the batches in flight hold (training/sweep.Sweeper's row_cap)."""
        return max(0, self.stage_rows - self.stage_reserve)

    @property
    def fits(self) -> bool:
        return self.must_fit <= self.budget.bytes

    @property
    def mapped_files_fit(self) -> bool:
        """Whether the budget also holds every memory-mapped byte training reads (the whole CSC and, for
        memory-mapped features, the whole feature matrix) in the page cache beside the anonymous part.
        If not, page faults should read only their page (read-around would evict what the next batch needs)."""
        # must_fit counts the whole CSC already; one batch's feature pages become the whole matrix
        mapped_features = self.feature_bytes if self.feature_cache == "mmap" else 0
        pages = self.parts.get(PAGES_PART, 0)
        return self.must_fit - pages + mapped_features <= self.budget.bytes

    def line(self) -> str:
        return (
            f"memory: estimate {gb(self.must_fit)} of a {gb(self.budget.bytes)} budget ({self.budget.why}) "
            f"· features {self.features_said()} · prefetch {self.prefetch}"
            + (f" · hot-feature cache {gb(self.parts[CACHE_PART])}" if self.cache_rows else "")
            + f" · graph structure {'in RAM' if self.structure == 'memory' else 'memory-mapped'}"
            + f" · peak RSS ~{gb(self.rss)}"
            + (" counting mapped files (reclaimable)" if self.rss > self.must_fit else "")
        )

    def features_said(self) -> str:
        if self.feature_cache == "read" and self.sums_bytes:
            return (
                "read from disk in passes over the file, each chunk added into the first-layer sums of a "
                f"cohort of batches ({gb(self.sums_bytes)} for two cohorts)"
            )
        if self.feature_cache == "read":
            return (
                f"read from disk by a sweep over the file (up to {self.stage_batches} "
                f"batch{'' if self.stage_batches == 1 else 'es'} in flight "
                f"sharing a pool of {self.stage_rows:,} rows, each held once, {gb(self.parts[STAGE_PART])})"
            )
        return "in RAM" if self.feature_cache == "memory" else "memory-mapped"

    def as_dict(self) -> dict:
        return {
            "feature_cache": self.feature_cache,
            "prefetch": self.prefetch,
            "cache_rows": self.cache_rows,
            "structure": self.structure,
            **(
                {
                    "stage_rows": self.stage_rows,
                    "stage_reserve": self.stage_reserve,
                    "stage_batches": self.stage_batches,
                }
                if self.stage_rows
                else {}
            ),
            **({"sums_bytes": self.sums_bytes} if self.sums_bytes else {}),
            **({"eval_batch_size": self.eval_batch_size} if self.eval_batch_size else {}),
            "mapped_files_fit": self.mapped_files_fit,
            "must_fit_mb": round(self.must_fit / 2**20, 1),
            "rss_estimate_mb": round(self.rss / 2**20, 1),
            "budget_mb": round(self.budget.bytes / 2**20, 1),
            "budget": self.budget.why,
            "parts_mb": {k: round(v / 2**20, 1) for k, v in self.parts.items()},
        }


def _step_bytes(s: Sizes, shape: BatchShape, train: bool) -> int:
    """One batch's blocks and activations (with their gradients when training)."""
    blocks = sum(e * 8 * 4 for e in shape.edges)  # src, dst, the block's CSC and edge ids: int64 each
    acts = 0
    for i, dst in enumerate(shape.dst_rows):
        d_in, d_out = s.dims[i], s.dims[i + 1]
        # Aggregated neighbours (d_in), self and neighbour projections, the output (+ dropout mask); a
        # hidden layer's norm adds its output and the activation's. Measured with batch norm (sage_2hop,
        # 256 -> 256, 9.6k first-layer rows): a training step's peak 116-144 MB, 121 MB counted this way.
        hidden_norm = s.norm and i + 1 < len(shape.dst_rows)
        acts += dst * (d_in + (5 if hidden_norm else 3) * d_out) * BYTES
        if d_in > d_out:  # dgl.nn's SAGEConv (mean, gcn) and GraphConv project every source row first
            acts += (shape.input_rows if i == 0 else shape.dst_rows[i - 1]) * d_out * BYTES
    if not train:
        return blocks + acts
    extra = shape.input_rows * s.feat_dim * BYTES if s.input_dropout else 0
    return blocks + 2 * acts + extra  # backward holds a gradient beside each saved activation


CACHE_PART = "hot-feature cache"
PAGES_PART = "feature pages one batch reads (mmap)"
STAGE_PART = "rows read ahead"
SUMS_PART = "first-layer sums (two cohorts)"
SLACK_PART = "allocator slack"
STRUCTURE_RAM, STRUCTURE_MMAP = "graph structure (in RAM)", "graph structure (mmap)"


def _block_bytes(shape: BatchShape) -> int:
    """A batch sampled ahead: its blocks (src, dst, the block's CSC and edge ids: int64 each per edge) and
    its input-node ids with their uncached copy and their rows' slots in the sweep's pool (int64 each per
    row)."""
    return sum(e * 8 * 4 for e in shape.edges) + shape.input_rows * 8 * 3


def estimate(
    w: Workload,
    feature_cache: str,
    prefetch: int,
    budget: Budget,
    *,
    cache_rows: int = 0,
    structure: str = "mmap",
    stage_rows: int = 0,
    stage_batches: int = 1,
    sums_bytes: int = 0,
) -> MemoryPlan:
    """feature_cache=read: stage_rows held by the batches in flight (0 = the largest batch's rows), up to
    stage_batches of them; with Sizes.first_sums instead sums_bytes for the cohorts' sums (at least a
    cohort of one batch each, the largest). structure: memory (the CSC read into RAM) | mmap."""
    s = w.sizes
    cache_rows = cache_rows if feature_cache in ("mmap", "read") else 0
    rows = max(w.train.input_rows, w.evals.input_rows)
    slots = prefetch + 2 if prefetch > 0 else 1
    cast = s.feat_itemsize != BYTES  # fp16/bf16 features are cast to float32 after the gather
    mapped_features = s.feature_bytes if feature_cache == "mmap" else 0
    stage = {}
    sums = feature_cache == "read" and s.first_sums
    if sums:  # no input rows gathered: the first layer's sums come from the pass (training/sum_sweep.py)
        prefetch, slots, rows = 0, 0, 0
        sums_bytes = max(int(sums_bytes), 2 * max(sums_batch_bytes(s, w.train), sums_batch_bytes(s, w.evals)))
        stage = {SUMS_PART: sums_bytes, "read buffers": PASS_BYTES}
        stage_rows, stage_batches = 0, 0
    elif feature_cache == "read":
        prefetch, slots = 0, 1  # the sweep reads ahead itself; gathers from what it read run inline
        stage_rows = max(int(stage_rows), rows)
        stage = {
            STAGE_PART: stage_rows * (s.row_bytes + SLOT_INDEX_BYTES),
            "blocks in flight": stage_batches * _block_bytes(w.train),
            "read buffers": _read_buffers(s, stage_rows - rows),
            "sweep node -> slot map": node_map_bytes(s.num_nodes),
        }
    else:
        stage_rows, stage_batches, sums_bytes = 0, 0, 0
    parts = {
        "process now": w.anon_now,
        "features in RAM": s.feature_bytes if feature_cache == "memory" else 0,
        "gather buffers": int(slots * rows * 1.25 * s.feat_dim * s.feat_itemsize)
        # fp16/bf16 rows cast: the whole gathered batch, or with the sums a chunk at a time
        + (
            (SUMS_CHUNK_BYTES // s.feat_itemsize * BYTES if sums else rows * s.feat_dim * BYTES)
            if cast
            else 0
        ),
        "batch working set": max(_step_bytes(s, w.train, True), _step_bytes(s, w.evals, False)),
        "optimizer": s.num_params * BYTES * 4,  # weights, gradients, Adam's two moments
        "trainer overhead (measured constant)": TRAINER_OVERHEAD,
        **stage,
        **({CACHE_PART: FeatureStore.cache_cost(s.num_nodes, s.row_bytes, cache_rows)} if cache_rows else {}),
        (STRUCTURE_RAM if structure == "memory" else STRUCTURE_MMAP): s.csc_bytes,
        # Training batches, not the once-an-epoch evaluation pass, decide whether the page cache thrashes.
        **(
            {PAGES_PART: int(mapped_features * _pages_touched(s, w.train.input_rows))}
            if mapped_features
            else {}
        ),
    }
    mapped = (STRUCTURE_MMAP, PAGES_PART)
    parts[SLACK_PART] = int(ALLOCATOR_SLACK * sum(parts.get(k, 0) for k in TRANSIENT_PARTS))
    anon = sum(v for k, v in parts.items() if k not in mapped)
    # RSS also counts the mapped pages already touched, the CSC, and feature pages read through the mmap.
    rss = anon + w.mapped_now + (s.csc_bytes if structure == "mmap" else 0) + mapped_features
    must_fit = anon + sum(parts.get(k, 0) for k in mapped)
    return MemoryPlan(
        feature_cache, prefetch, parts, must_fit, rss, budget, cache_rows, s.feature_bytes,
        structure=structure, stage_rows=stage_rows, stage_batches=stage_batches,
        stage_reserve=rows if stage_rows else 0, sums_bytes=sums_bytes if sums else 0,
    )  # fmt: skip


def sums_batch_bytes(s: Sizes, shape: BatchShape) -> int:
    """What one batch of this shape costs a cohort of the first-layer sums (sum_sweep.shape_bytes)."""
    return shape_bytes(shape.dst_rows[0], shape.edges, shape.dst_rows, shape.input_rows, s.feat_dim)


def cohort_batches(w: Workload, p: MemoryPlan) -> int:
    """Training batches a pass of the first-layer sums serves under plan p (SumSweep.cohort_size)."""
    return batches_a_pass(p.sums_bytes, sums_batch_bytes(w.sizes, w.train))


def _pages_touched(s: Sizes, rows: int) -> float:
    """The fraction of the feature file's 4 KiB pages that `rows` random rows land on."""
    per_page = max(1, 4096 // max(s.feat_dim * s.feat_itemsize, 1))
    return 1.0 - (1.0 - min(rows / max(s.num_nodes, 1), 1.0)) ** per_page


def plan(
    w: Workload,
    feature_cache: str,
    prefetch: int,
    budget: Budget,
    cache_rows: int = 0,
    resident_ok: bool = True,
) -> tuple[MemoryPlan, list[str]]:
    """The plan to run with and what was decided to get there (one line each): features in RAM only
    when that fits (feature_cache=auto; else read from disk by the sweep), the graph structure in RAM when it
    fits (resident_ok), prefetch shrunk to fit, a hot-feature cache of up to cache_rows rows, then the
    rows read ahead in what is left. The plan may still not fit."""
    decisions = []
    caches = ["memory", LEAN_FEATURES] if feature_cache == "auto" else [feature_cache]
    # The CSC counts in full either way (sampling reads all of it), so it is held in RAM whenever the run
    # fits at all; a link run's message-passing graph is its edge split's, placed by it (resident_ok=False).
    structures = ["memory"] if resident_ok else ["mmap"]
    for cache in caches:
        for structure in structures:
            for depth in range(prefetch, -1, -1):
                p = estimate(w, cache, depth, budget, structure=structure)
                if not p.fits:
                    continue
                if feature_cache == "auto":
                    decisions.append(
                        "features in RAM: they fit the memory budget"
                        if cache == "memory"
                        else "features read from disk ahead of the model: held in RAM they would not fit "
                        "the memory budget"
                    )
                if depth < prefetch and cache != "read":
                    decisions.append(f"prefetch {prefetch} -> {depth}: a deeper prefetch would not fit")
                if cache_rows > 0:
                    p = _with_cache(w, p, cache_rows, decisions)
                if cache == "read":
                    p = _with_sums(w, p) if w.sizes.first_sums else _with_staging(w, p)
                return p, decisions
    return estimate(w, caches[-1], 0, budget, structure=structures[-1]), decisions


def _read_buffers(s: Sizes, sweep_cap: int) -> int:
    """The sweep's two chunk buffers, and the reader's own where the sweep reads sparse rows (decided
    from its cap, as training/sweep.Sweeper decides)."""
    return SWEEP_BUFFERS + (0 if reads_dense(s.num_nodes, s.row_bytes, max(1, sweep_cap)) else READ_BUFFERS)


def _with_staging(w: Workload, p: MemoryPlan) -> MemoryPlan:
    """The plan with the rows read ahead grown into STAGE_SHARE of what the budget leaves, and up to
    MAX_STAGE_BATCHES batches in flight whose blocks take no more than a quarter of that memory (the rows
    the leanest plan holds already included: the largest batch, an evaluation one)."""
    s = w.sizes
    room = max(0, int((p.budget.bytes - p.must_fit) * STAGE_SHARE))
    block = max(int(_block_bytes(w.train) * (1 + ALLOCATOR_SLACK)), 1)  # a held block brings its slack
    per_row = s.row_bytes + SLOT_INDEX_BYTES
    batches = int(
        max(1, min(MAX_STAGE_BATCHES, (room + p.stage_rows * per_row) // 4 // block, 1 + room // block))
    )
    room -= (batches - 1) * block
    rows = min(s.num_nodes, p.stage_rows + room // per_row)
    freed = p.parts["read buffers"] - _read_buffers(s, rows - p.stage_rows)  # whole chunks: no reader buffers
    rows = min(s.num_nodes, rows + int(freed * STAGE_SHARE) // per_row)
    return estimate(
        w, p.feature_cache, p.prefetch, p.budget,
        cache_rows=p.cache_rows, structure=p.structure, stage_rows=rows, stage_batches=batches,
    )  # fmt: skip


def _with_sums(w: Workload, p: MemoryPlan) -> MemoryPlan:
    """The plan with the first-layer sums' cohorts grown into STAGE_SHARE of what the budget leaves."""
    room = max(0, int((p.budget.bytes - p.must_fit) * STAGE_SHARE))
    return estimate(
        w, p.feature_cache, p.prefetch, p.budget, structure=p.structure, sums_bytes=p.sums_bytes + room
    )


def refusal(w: Workload, p: MemoryPlan, batch_size: int, eval_batch_size: int) -> tuple[str, str]:
    """(what is wrong, how to fix it) for a plan that does not fit its budget."""
    budget = p.budget
    lean = estimate(w, LEAN_FEATURES, 0, budget)
    need, have = gb(p.must_fit), gb(budget.bytes)
    if need == have:  # a near miss: the digits that tell them apart
        need, have = f"{p.must_fit / 1e9:.3f} GB", f"{budget.bytes / 1e9:.3f} GB"
    what = (
        f"train needs about {need} (features {p.features_said()}, "
        f"prefetch {p.prefetch}) but its memory budget is {have} ({budget.why})"
    )
    if lean.fits and p.feature_cache != LEAN_FEATURES:
        return what, f"use train.feature_cache=auto (features read from disk fit: {gb(lean.must_fit)})"
    found = _fitting(w, batch_size, eval_batch_size, budget)
    if found is None:
        return what, "it does not fit even at batch size 16: use a machine with more memory" + _OR
    train_bs, eval_bs, smaller, p = found
    slow = ""
    if (
        cohort_batches(smaller, _with_sums(smaller, p)) < 2
        if smaller.sizes.first_sums
        else _with_staging(smaller, p).sweep_cap < smaller.train.input_rows
    ):
        # no room for a second batch's rows: each batch would read about the whole feature file alone
        # (1M-node bench graph in 0.9 GB at the batch size named: 0.066x its uncapped speed)
        slow = (
            ", though slowly: one batch at a time would share a pass over the feature file, each reading "
            "about all of it (`gnnscale profile` predicts the speed)"
        )
    return what, f"it would fit with {_settings(batch_size, train_bs, eval_bs, p)}{slow}{_OR}"


_OR = "; or raise the limit, or set train.memory_budget=SIZE if the limit read is wrong"


def _settings(batch_size: int, train_bs: int, eval_bs: int, p: MemoryPlan) -> str:
    keys = [f"train.batch_size={train_bs}"] if train_bs != batch_size else []
    return " ".join([*keys, f"train.eval_batch_size={eval_bs}", f"(estimate {gb(p.must_fit)})"])


def fitting_settings(w: Workload, batch_size: int, eval_batch_size: int, budget: Budget) -> str | None:
    """Override suggestions that would fit (the leanest plan: features read ahead, no prefetch), or None."""
    found = _fitting(w, batch_size, eval_batch_size, budget)
    return None if found is None else _settings(batch_size, found[0], found[1], found[3])


def _fitting(w: Workload, batch_size: int, eval_batch_size: int, budget: Budget):
    """(training and evaluation batch sizes, their workload, the leanest plan) of the largest batches that
    fit, halving from the configured ones, or None."""
    train_bs = batch_size
    while train_bs >= 16:
        # Evaluation batches first come down to the training size: they are the largest.
        eval_bs = min(eval_batch_size, train_bs)
        smaller = w.scaled(train_bs / batch_size, eval_bs / eval_batch_size)
        p = estimate(smaller, LEAN_FEATURES, 0, budget)
        if p.fits:
            return train_bs, eval_bs, smaller, p
        train_bs //= 2
    return None


def _with_cache(w: Workload, p: MemoryPlan, rows: int, decisions: list[str]) -> MemoryPlan:
    """The plan with the largest hot-feature cache up to `rows` that still fits, the choice said."""
    s = w.sizes
    asked = gb(FeatureStore.cache_cost(s.num_nodes, s.row_bytes, rows))
    if p.feature_cache == "read" and s.first_sums:
        decisions.append(
            f"hot-feature cache off (train.cache_gb, {asked}): the first-layer sums are added as the whole "
            "feature file is read, cached rows would not be read less"
        )
        return p
    if p.feature_cache == "memory":
        decisions.append(
            f"hot-feature cache off (train.cache_gb, {asked}): the features are held in RAM, every gather is "
            "a memory copy already"
        )
        return p
    rows = min(rows, s.num_nodes)
    room = p.budget.bytes - p.must_fit - s.num_nodes * 4  # the slot map comes with any cache
    fit = max(0, min(rows, room // max(s.row_bytes, 1)))
    if fit < rows:
        got = gb(FeatureStore.cache_cost(s.num_nodes, s.row_bytes, fit)) if fit else "off"
        decisions.append(
            f"hot-feature cache {asked} -> {got}: a larger one would not fit the memory budget "
            f"({gb(p.budget.bytes)}; the rest of training needs {gb(p.must_fit)})"
        )
    return (
        estimate(w, p.feature_cache, p.prefetch, p.budget, cache_rows=fit, structure=p.structure)
        if fit
        else p
    )
