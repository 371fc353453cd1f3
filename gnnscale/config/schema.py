"""Typed schemas for every config group option and stage; registered in Hydra's ConfigStore.

Each YAML option lists its schema first in `defaults`, so an unknown key or a wrongly typed value
fails while Hydra composes, before any stage runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING


# ---------------------------------------------------------------- data sources (group `data`)
@dataclass
class DataConfig:
    source: str = MISSING
    name: str = MISSING
    path: Optional[str] = None
    # Store every edge in both directions (GNN message passing wants symmetric neighbourhoods).
    make_undirected: bool = True
    self_loops: str = "remove"  # keep | remove | add
    duplicate_edges: str = "remove"  # keep | remove
    # Use the split the source ships (Planetoid public split, tolokers masks) when it has one.
    use_source_split: bool = True
    split_index: int = 0  # which of several shipped splits (e.g. tolokers has 10)
    split_fractions: List[float] = field(default_factory=lambda: [0.6, 0.2, 0.2])
    chunk_edges: int = 4_000_000  # edges read per streaming step


@dataclass
class SyntheticDataConfig(DataConfig):
    source: str = "synthetic"
    name: str = "synthetic"
    num_nodes: int = 20_000
    avg_degree: float = 20.0
    feat_dim: int = 64
    num_classes: int = 8
    homophily: float = 0.75  # probability an edge stays inside its community (= class)
    power_law_exponent: float = 2.5  # degree propensity ~ Pareto; smaller = heavier tail
    feature_signal: float = (
        0.3  # class-mean scale vs unit Gaussian noise (0.3: features alone ~0.79 acc, SAGE ~0.99)
    )
    seed: int = 0
    use_source_split: bool = False
    labels: bool = True  # false: store no labels (every node -1, num_classes 0): a graph for task=link


@dataclass
class PlanetoidDataConfig(DataConfig):
    source: str = "planetoid"
    name: str = "auto"  # cora | citeseer | pubmed | auto (from the ind.<name>.* files)


@dataclass
class NpzDataConfig(DataConfig):
    source: str = "npz"
    name: str = "auto"  # from the file name


@dataclass
class EdgelistDataConfig(DataConfig):
    source: str = "edgelist"
    name: str = "auto"
    # .npy [N, F]; unset: seeded random features (feat_dim); `none`: structural [1, log1p(degree)]
    features: Optional[str] = None
    labels: Optional[str] = None  # .npy [N], -1 = unlabelled; unset: no labels (task=link only)
    split: Optional[str] = None  # .npy [N] of 0 train / 1 val / 2 test / -1 none
    num_nodes: int = 0  # 0 = the label file's length; if set, it must agree with it
    delimiter: str = "auto"  # auto | , | tab | space
    feat_dim: int = 16  # used only when no feature file is given (random features)
    feat_seed: int = 0  # seeds those random features


@dataclass
class DglDataConfig(DataConfig):
    source: str = "dgl"
    name: str = "auto"
    feat_key: str = "feat"
    label_key: str = "label"
    graph_index: int = 0


@dataclass
class OgbDataConfig(DataConfig):
    source: str = "ogb"
    name: str = "auto"
    split_name: str = "auto"  # folder under split/ (e.g. sales_ranking, time)


# ---------------------------------------------------------------- tasks (group `task`)
@dataclass
class TaskConfig:
    name: str = "node"  # node (classification) | link (edge prediction)


@dataclass
class LinkTaskConfig(TaskConfig):
    """`task=link`: edge prediction on a seeded train / val / test split of the edges (storage/edge_split.py)."""

    name: str = "link"
    val_fraction: float = 0.05  # of the edges (an undirected edge's two directions count once)
    test_fraction: float = 0.10
    split_file: Optional[str] = None  # .npz with val / test [P, 2] (src, dst) arrays: your own split
    num_negatives: int = 1  # sampled negatives per positive edge while training
    negative_sampler: str = "uniform"  # uniform | degree (degree^0.75, as word2vec and PinSAGE)
    # share of the negatives drawn as friends of friends of the source that are not yet its partners (hard
    # negatives: they teach the decoder to order the pairs that share neighbours; sampling/two_hop.py)
    hard_negatives: float = 0.0
    in_batch_negatives: bool = False  # also score each source against the batch's other destinations
    decoder: str = "dot"  # dot | mlp (on the endpoints' elementwise product)
    # the decoder also reads each pair's common neighbours, Adamic-Adar and resource allocation (exact, from
    # the message-passing graph: no val / test edge reaches them); dot: a small MLP of them added to <a, b>
    pair_features: bool = False
    # decoder=dot with pair_features: one more count, the common neighbours each weighted by a learned
    # function of its degree (AA and RA are two fixed such weightings)
    learned_common: bool = False
    # rank every evaluation's positives by CN / AA / RA too, reported beside the model (4 B per edge of RAM)
    heuristics: bool = True
    loss: str = "bce"  # bce | margin (hinge on pos - neg, margin 1)
    # negatives each val / test positive is ranked against (OGB protocol); 0 = all nodes, filtered (known
    # edges of the source other than the target are no negatives: configs/task/link.yaml)
    eval_negatives: int = 1000
    metric: str = "auc"  # early stopping and the summary: auc | mrr | hits@10 | hits@50 | hits@100
    # cluster_gcn: the share of a batch's edges that are its targets (removed from its message passing)
    target_fraction: float = 0.3
    # edges: the training edges are the positives; random_walk: pairs met on short random walks
    # (unsupervised GraphSAGE, +exp=sage_unsup), walk_length steps from each node with a neighbour
    positives: str = "edges"
    walk_length: int = 5


TASK_SCHEMAS = {"node": TaskConfig, "link": LinkTaskConfig}


# ---------------------------------------------------------------- models (group `model`)
@dataclass
class ModelConfig:
    arch: str = "sage"  # sage | gcn | mlp (features only; the baseline structure must beat)
    hidden: int = 256
    num_layers: int = 2
    aggregator: str = "mean"  # SAGE: mean | pool | lstm | gcn
    dropout: float = 0.5
    norm: str = "none"  # none | batch | layer
    # Append log1p(in-degree) to every node's input features: mean aggregation averages a node's degree
    # away, and where degree drives who links to whom (most real graphs) it is the strongest single signal.
    degree_feature: bool = False


MODEL_SCHEMAS = {"sage": ModelConfig, "gcn": ModelConfig, "mlp": ModelConfig}


# ---------------------------------------------------------------- samplers (group `sampler`)
@dataclass
class SamplerConfig:
    """Fields every formation has; each kind's schema below adds its own."""

    kind: str = (
        "neighbor"  # neighbor | labor | importance | weighted | random_walk | cluster_gcn | saint | full
    )
    # Seed batches (formations that batch training seeds): random, or stratified = every batch holds the
    # training labels' class proportions (a remedy for batches dominated by one class).
    seed_order: str = "random"


@dataclass
class NeighborSamplerConfig(SamplerConfig):
    # Neighbours sampled per layer, input layer first (DGL's order); -1 = all neighbours.
    fanouts: List[int] = field(default_factory=lambda: [25, 10])
    replace: bool = False  # sample with replacement


@dataclass
class LaborSamplerConfig(SamplerConfig):
    kind: str = "labor"
    fanouts: List[int] = field(default_factory=lambda: [25, 10])
    importance_sampling: int = (
        0  # LABOR-i: iterations of importance sampling (0 = LABOR-0, -1 = to convergence)
    )
    layer_dependency: bool = False  # the same random variates in every layer (fewer distinct nodes)


@dataclass
class ImportanceSamplerConfig(SamplerConfig):
    kind: str = "importance"
    fanouts: List[int] = field(default_factory=lambda: [25, 10])
    score: str = "degree"  # degree | pagerank: a neighbour is drawn with probability ~ its score
    pagerank_damping: float = 0.85
    pagerank_iters: int = 50
    replace: bool = False


@dataclass
class WeightedSamplerConfig(SamplerConfig):
    kind: str = "weighted"
    fanouts: List[int] = field(default_factory=lambda: [25, 10])
    edge_weight: str = "weight"  # the edge-data column whose values are the sampling weights
    replace: bool = False


@dataclass
class RandomWalkSamplerConfig(SamplerConfig):
    kind: str = "random_walk"
    # Per layer, input layer first: the k most visited nodes of the walks become a node's neighbours.
    fanouts: List[int] = field(default_factory=lambda: [10, 10])
    num_walks: int = 20  # walks started from each node
    walk_length: int = 3  # hops per walk (PinSAGE: num_traversals)
    restart_prob: float = 0.5  # probability a walk stops after each hop


@dataclass
class ClusterGcnSamplerConfig(SamplerConfig):
    kind: str = "cluster_gcn"
    num_parts: int = 0  # METIS clusters; 0 = about one per 1,000 nodes (gnnscale partition makes them)
    nodes_per_part: int = 0  # with num_parts 0: ceil(num_nodes / nodes_per_part) clusters (size-free)
    method: str = "metis"  # metis | random: the partition the clusters come from
    clusters_per_batch: int = 20  # random clusters joined per batch, with the edges between them


@dataclass
class SaintSamplerConfig(SamplerConfig):
    kind: str = "saint"
    mode: str = "node"  # node | edge | walk
    budget: int = 6000  # node mode: nodes per subgraph; edge mode: edges; walk mode: walk roots
    # node mode: a node's draw probability is ∝ colnorm (GraphSAINT's squared column norm of the normalised
    # adjacency), degree (its in-degree, as DGL's SAINTSampler) or uniform
    node_prob: str = "colnorm"
    walk_length: int = 2  # walk mode: hops per walk
    # Subgraphs pre-sampled to estimate the normalisation; 0 = GraphSAINT's rule (until the subgraphs hold
    # 50x the graph's nodes: every node drawn 50 times on average).
    num_presample: int = 0
    normalize: bool = True  # loss and aggregator normalisation (GraphSAINT's unbiased estimator)
    batches_per_epoch: int = 0  # 0 = as many as cover the training nodes about once


@dataclass
class FullSamplerConfig(SamplerConfig):
    kind: str = "full"


SAMPLER_SCHEMAS = {
    "neighbor": NeighborSamplerConfig,
    "labor": LaborSamplerConfig,
    "importance": ImportanceSamplerConfig,
    "weighted": WeightedSamplerConfig,
    "random_walk": RandomWalkSamplerConfig,
    "cluster_gcn": ClusterGcnSamplerConfig,
    "saint": SaintSamplerConfig,
    "full": FullSamplerConfig,
}


# ---------------------------------------------------------------- precision (group `precision`)
@dataclass
class PrecisionConfig:
    dtype: str = "fp32"  # fp32 | bf16 | fp16 (autocast; fp16 adds loss scaling)


PRECISION_SCHEMAS = {"fp32": PrecisionConfig, "bf16": PrecisionConfig, "fp16": PrecisionConfig}


# ---------------------------------------------------------------- scale-out (group `dist`)
@dataclass
class DistConfig:
    kind: str = "none"  # none (one process) | ddp (torchrun + DDP on this machine) | distdgl (DistDGL)
    # ddp: processes started on this machine (under `torchrun` its --nproc_per_node decides instead)
    nproc: int = 2
    backend: str = "auto"  # auto = nccl on CUDA (one GPU per local rank), gloo on CPU
    # Which training seeds each rank owns: random (nodes dealt to ranks at random) or metis (the rank's
    # METIS part, from `gnnscale partition`, so its sampled neighbourhoods stay mostly inside it)
    split: str = "random"
    grad_compression: str = "none"  # none | fp16 | bf16 | powersgd (DDP communication hooks)
    powersgd_rank: int = 8  # PowerSGD's matrix approximation rank (4 cost 1.2 accuracy points: bench_scaling)
    powersgd_start_iter: int = 2  # vanilla all-reduce for this many steps first (PowerSGD's warm-up)
    # K local steps between synchronisations (periodic model averaging); 1 = all-reduce every step
    local_steps: int = 1
    timeout_s: int = 300  # a collective waiting longer than this fails the job (a hung or lost rank)
    master_port: int = 0  # rendezvous port on this machine; 0 = a free one
    # ---- distdgl
    num_trainers: int = 2  # trainer processes per machine
    num_servers: int = 1  # DistDGL graph servers per machine
    num_samplers: int = 0  # DistDGL sampler processes per trainer (0 = sample in the trainer)
    ip_config: Optional[str] = None  # several machines: a file with one IP per line (one partition each)
    part_config: Optional[str] = None  # default: graph_dir/partitions/distdgl-<P>/<name>.json
    num_parts: int = 1  # partitions (= machines) the DistDGL graph is split into
    # with ip_config: this machine's line in it (0-based); -1 = the line holding one of this machine's addresses
    machine_rank: int = -1


DIST_SCHEMAS = {"none": DistConfig, "ddp": DistConfig, "distdgl": DistConfig}


# ---------------------------------------------------------------- run logging (group `logger`)
@dataclass
class LoggerConfig:
    # What a train run writes for people to look at; metrics.jsonl is written whatever this says (resume
    # and summary.json read it). jsonl: plus run_dir/curves.png; tensorboard: plus event files in
    # run_dir/tb/; none: metrics.jsonl alone.
    kind: str = "jsonl"
    # tensorboard: the batch loss (and gradient norm, when clipping or diagnostics compute it) every this
    # many batches, in run_dir/tb/batches/; 0 = per epoch only
    every_n_batches: int = 50


LOGGER_SCHEMAS = {"jsonl": LoggerConfig, "tensorboard": LoggerConfig, "none": LoggerConfig}


# ---------------------------------------------------------------- stages
@dataclass
class ShardOptions:
    nodes_per_shard: int = 100_000
    # Node order of the graph_dir (storage/node_order.py): none | degree | rcm. The map back to the
    # user's IDs is kept in graph_dir/node_order/ and applied to every user-facing output.
    reorder: str = "none"


@dataclass
class CscOptions:
    validate: bool = True


@dataclass
class UiOptions:
    # Off a terminal (a log file, a batch job) progress is one plain line this often, in seconds.
    log_every_s: float = 30.0


@dataclass
class StageBase:
    seed: int = 0
    graph_dir: str = "graphs/${data.name}"
    run_dir: Optional[str] = None  # default: runs/<stage>/<timestamp>
    overwrite: bool = False
    data: Any = MISSING
    # The key=value overrides this config was composed with (filled in by gnnscale, recorded in
    # config.yaml): a setting the user chose is never replaced by a profile such as train.few_labels.
    cli_overrides: List[str] = field(default_factory=list)
    ui: UiOptions = field(default_factory=UiOptions)


# What a stage that reads a graph_dir checks first (storage/verify.py): stamp = re-hash only the files
# whose verification stamp no longer matches, full = re-hash every file, off = nothing.
VERIFY_DEFAULT = "stamp"


@dataclass
class ShardStageConfig(StageBase):
    shard: ShardOptions = field(default_factory=ShardOptions)


@dataclass
class BuildCscStageConfig(StageBase):
    csc: CscOptions = field(default_factory=CscOptions)
    verify: str = VERIFY_DEFAULT  # stamp | full | off: the shards it reads


@dataclass
class InferOptions:
    mode: str = "layerwise"  # layerwise (all nodes, exact) | sampled (a subset); --layerwise / --sampled
    batch_size: int = 16384  # destination nodes per batch
    layer: Optional[int] = None  # the layer whose output is embeddings.npy (1..L); default: last hidden
    # auto = 90% of the memory limit (cgroup or MemAvailable), or a size (6GB): two layers' rows (input +
    # output) must fit, else layers stream from disk
    memory_budget: str = "auto"
    storage: str = "auto"  # auto (decided by memory_budget) | memory | disk
    cache_layers: bool = True  # keep every layer's output in run_dir/layers/ so --update can reuse it
    probabilities: bool = False  # also write probabilities.npy (softmax of the logits)
    split: str = "test"  # the split whose accuracy summary.json reports
    # --sampled: one fanout per layer (first = input layer), -1 = all neighbours; empty = 10 each
    fanouts: List[int] = field(default_factory=list)
    nodes: str = "test"  # --sampled: a split name (train | val | test | all) or a .npy of node ids
    changes: Optional[str] = None  # --update CHANGES.npz: incremental re-inference from a previous run
    base: Optional[str] = None  # --update: the infer run_dir to update; default: newest cached layer-wise
    write_graph: Optional[str] = None  # --update: also write the updated graph as a graph_dir here
    device: str = "cpu"
    num_threads: int = 0  # torch threads; 0 = torch's default
    # task=link: an edge split's name (its train summary's edge_split): embeddings over that split's
    # message-passing graph, the held-out edges unseen, for `recommend` to measure recall on them
    edge_split: Optional[str] = None


@dataclass
class InferStageConfig(StageBase):
    ckpt: Optional[str] = None  # checkpoint file or train run_dir; default the newest run under runs/train
    graph_dir: Optional[str] = None  # default: the graph the checkpoint was trained on
    data: Any = None
    infer: InferOptions = field(default_factory=InferOptions)
    verify: str = VERIFY_DEFAULT  # stamp | full | off: the graph_dir files it reads


@dataclass
class RecommendOptions:
    k: int = 20  # candidate partners per node (not itself, not already a neighbour in either direction)
    nodes: Any = None  # None = every node; a list of ids, or a .npy / .txt file of node ids
    metric: str = "ip"  # ip (inner product) | cosine (inner product of L2-normalised embeddings)
    index: str = "auto"  # auto (exact below exact_below nodes, else ivf) | exact | ivf | hnsw
    exact_below: int = 200_000
    nlist: int = 0  # ivf: inverted lists; 0 = 4 * sqrt(num_nodes)
    nprobe: int = 0  # ivf: lists searched per query; 0 = the smallest power of 2 reaching target_recall
    hnsw_m: int = 32  # hnsw: links per node
    ef_construction: int = 64  # hnsw: build-time beam
    ef_search: int = 0  # hnsw: search beam; 0 = the smallest power of 2 reaching target_recall
    target_recall: float = 0.95  # approximate index: recall@k vs exact search the tuning aims for
    recall_sample: int = 1000  # queries whose approximate results are checked against exact search
    chunk_size: int = 8192  # queries per search call (bounds the result buffers)
    format: str = "npy"  # npy (recommendations.npy + scores.npy) | csv (recommendations.csv)
    num_threads: int = 0  # faiss OpenMP threads; 0 = faiss's default
    # auto: re-rank when the embeddings' checkpoint has a pair decoder (task.pair_features or decoder=mlp):
    # the search's top `candidates` joined with the `fof_candidates` friends of friends with the most
    # common neighbours, scored by that decoder | on | off (inner product / cosine only)
    rerank: str = "auto"
    candidates: int = 100
    fof_candidates: int = 100


@dataclass
class RecommendStageConfig(StageBase):
    emb: Optional[str] = None  # an embeddings .npy or an infer run_dir; default the newest under runs/infer
    infer_dir: Optional[str] = None  # an infer run_dir (same as emb=RUN_DIR)
    graph_dir: Optional[str] = None  # default: the graph the embeddings were computed on (emb_info.json)
    data: Any = None
    recommend: RecommendOptions = field(default_factory=RecommendOptions)
    verify: str = VERIFY_DEFAULT  # stamp | full | off: the graph_dir files it reads (shards, CSC)


@dataclass
class FewLabelsOptions:
    """Settings that replace the usual ones when the train split has few labelled nodes.

    Semi-supervised benchmarks (Planetoid: 20 labels per class) overfit a model sized for millions of
    labels within a few epochs; they want strong regularisation instead. Unset fields keep the usual value.
    """

    below: int = 0  # applies when the train split has fewer labelled nodes than this; 0 = never
    aggregator: Optional[str] = None  # -> model.aggregator
    norm: Optional[str] = None  # -> model.norm
    dropout: Optional[float] = None  # -> model.dropout
    input_dropout: Optional[float] = None  # -> train.input_dropout
    lr: Optional[float] = None  # -> train.lr
    weight_decay: Optional[float] = None  # -> train.weight_decay


@dataclass
class PhaseOptions:
    """One phase of a multi-phase schedule (train.phases): its epochs, and what it changes."""

    epochs: int = MISSING
    batch_size: Optional[int] = None  # default train.batch_size
    fanouts: Optional[List[int]] = None  # default sampler.fanouts


@dataclass
class TrainOptions:
    batch_size: int = 1024  # seed (output) nodes per mini-batch
    epochs: int = 20
    lr: float = 0.003
    weight_decay: float = 0.0
    optimizer: str = "adam"  # adam | adamw
    warmup_epochs: float = 0.0  # linear LR warmup, then `schedule`
    schedule: str = "cosine"  # none | cosine | step
    min_lr_ratio: float = 0.0  # cosine: the final LR as a fraction of lr
    step_epochs: int = 10  # step: decay every this many epochs ...
    step_gamma: float = 0.5  # ... by this factor
    grad_clip: float = 1.0  # max global gradient norm, applied before optimizer.step(); 0 = off
    class_weights: bool = False  # weight the loss by inverse train-label frequency
    input_dropout: float = (
        0.0  # dropout on the input features while training (sparse bag-of-words graphs like it)
    )
    num_workers: int = 0  # DGL DataLoader sampling processes (0 = sample in this process)
    # Batches whose features are gathered ahead in a background thread; 0 = inline. -1 = auto: 2 on a GPU
    # (the CPU is otherwise idle while it computes), 0 on CPU (a gather thread would steal the cores the
    # model's own threads use: 1.21x slower epochs on the 2-core benchmark machine, bench/results/train.json).
    prefetch: int = -1
    num_threads: int = 0  # torch intra-op threads; 0 = every core this process may use
    eval_every: int = 1  # validate every this many epochs
    eval_fanouts: Optional[List[int]] = None  # validation/test fanouts; default sampler.fanouts
    eval_batch_size: int = 0  # 0 = batch_size (eval_batch_size()): the same metrics whatever the memory
    patience: int = 10  # stop after this many epochs without a better val metric; 0 = never
    metric: str = "acc"  # acc | f1_macro | roc_auc (binary)
    resume: bool = False  # continue from <run_dir>/checkpoints/last.pt (newest run if run_dir unset)
    # auto | memory | read | mmap: features held in RAM; read from the shards by a sweep ahead (parallel,
    # coalesced reads: what auto picks when RAM cannot hold them); or page-faulted through memory maps
    feature_cache: str = "auto"
    # Hot-feature cache, GB of feature rows (0 = off): with memory-mapped features, the rows of the
    # highest in-degree nodes are held in RAM and the rest read from the shards. It lives under train,
    # not storage: like feature_cache it is a per-run choice the train memory plan sizes (shrunk, said in
    # one line, when the budget has less room), not a property of the graph_dir.
    cache_gb: float = 0.0
    # What the run may use: auto = 90% of the memory limit it runs under (cgroup v2/v1, else
    # MemAvailable), or a size (6GB). Decides feature_cache=auto and the prefetch depth; a run that
    # cannot fit exits before training with settings that would.
    memory_budget: str = "auto"
    device: str = "auto"  # auto | cpu | cuda
    few_labels: FewLabelsOptions = field(default_factory=FewLabelsOptions)
    # Phases run in order, each with its own batch size and fanouts (e.g. coarse: big batches, small
    # fanouts; then fine). Empty = one phase of train.epochs; else the phases' epochs add up to the run.
    phases: List[PhaseOptions] = field(default_factory=list)
    # Training-health signals in metrics.jsonl (batch label imbalance, loss / gradient-norm spread,
    # batch overlap, over-smoothing), each with a warning when it trips.
    diagnostics: bool = True


@dataclass
class TrainStageConfig(StageBase):
    resume: Optional[str] = None  # RUN_DIR: continue that run from its checkpoints/last.pt
    task: Any = MISSING
    model: Any = MISSING
    sampler: Any = MISSING
    precision: Any = MISSING
    dist: Any = MISSING
    logger: Any = MISSING
    train: TrainOptions = field(default_factory=TrainOptions)
    verify: str = VERIFY_DEFAULT  # stamp | full | off: the graph_dir files it reads


@dataclass
class PartitionOptions:
    method: str = "metis"  # metis (fewest cut edges) | random (no memory beyond the assignment)
    num_parts: Optional[int] = None  # unset = about one part per 1,000 nodes (Cluster-GCN's clusters)
    balance_train: bool = True  # METIS balances training nodes per part too (as DistDGL does)
    # auto = 90% of the memory limit (cgroup or MemAvailable), or a size (6GB): METIS must fit in it
    memory_budget: str = "auto"


@dataclass
class PartitionStageConfig(StageBase):
    partition: PartitionOptions = field(default_factory=PartitionOptions)
    verify: str = VERIFY_DEFAULT  # stamp | full | off: the graph_dir files it reads


@dataclass
class VerifyStageConfig(StageBase):
    """`gnnscale verify`: every file meta.json records, re-hashed (full) or by stamp."""

    verify: str = "full"


@dataclass
class ProfileOptions:
    # What the plan must fit in: auto = 90% of the memory limit (cgroup or MemAvailable), or of the GPU's
    # memory when train.device is cuda; or a size (64GB)
    memory_budget: str = "auto"
    measure: bool = False  # also time num_batches training steps (split, rates, bounds, doubling test)
    num_batches: int = 20  # batches timed by profile.measure
    probe_batches: int = 5  # batches sampled by the plan to count unique nodes / edges (overlap)
    compare_samplers: bool = False  # 1-2 epochs of every formation on this graph, a table and a winner
    compare_epochs: int = 1
    # the formations compared; empty = every sampler preset (sampling.PRESETS)
    samplers: List[str] = field(default_factory=list)
    trace: bool = False  # with measure: a torch.profiler Chrome trace (trace.json) of a few batches
    plots: bool = True  # PNGs next to profile.json (degree distribution, time split, memory)
    # A graph described instead of read (no graph_dir needed): num_nodes > 0 plans from these numbers
    num_nodes: float = 0  # e.g. 1e9
    avg_degree: float = 0.0
    feat_dim: int = 128
    num_classes: int = 16
    train_fraction: float = 0.6


@dataclass
class ProfileStageConfig(StageBase):
    model: Any = MISSING
    sampler: Any = MISSING
    precision: Any = MISSING
    dist: Any = MISSING
    train: TrainOptions = field(default_factory=TrainOptions)
    profile: ProfileOptions = field(default_factory=ProfileOptions)


@dataclass
class PipelineStageConfig(TrainStageConfig):
    """The train keys plus every other stage's options; the pipeline hands each stage only its own."""

    shard: ShardOptions = field(default_factory=ShardOptions)
    csc: CscOptions = field(default_factory=CscOptions)
    partition: PartitionOptions = field(default_factory=PartitionOptions)
    infer: InferOptions = field(default_factory=InferOptions)
    recommend: RecommendOptions = field(default_factory=RecommendOptions)
    # partition runs only when the sampler trains on one (sampler=cluster_gcn); otherwise it is left out.
    # task=link with stages left unset also runs recommend after infer (pipeline/plan.py resolve_stages).
    stages: List[str] = field(default_factory=lambda: ["shard", "build_csr", "partition", "train", "infer"])


DATA_SCHEMAS = {
    "synthetic": SyntheticDataConfig,
    "planetoid": PlanetoidDataConfig,
    "npz": NpzDataConfig,
    "edgelist": EdgelistDataConfig,
    "dgl": DglDataConfig,
    "ogb": OgbDataConfig,
}

STAGE_SCHEMAS = {
    "shard": ShardStageConfig,
    "build_csr": BuildCscStageConfig,
    "partition": PartitionStageConfig,
    "pipeline": PipelineStageConfig,
    "train": TrainStageConfig,
    "infer": InferStageConfig,
    "profile": ProfileStageConfig,
    "recommend": RecommendStageConfig,
    "verify": VerifyStageConfig,
}

# group -> option -> schema; each configs/<group>/<option>.yaml lists `<option>_schema` first.
GROUP_SCHEMAS = {
    "data": DATA_SCHEMAS,
    "task": TASK_SCHEMAS,
    "model": MODEL_SCHEMAS,
    "sampler": SAMPLER_SCHEMAS,
    "precision": PRECISION_SCHEMAS,
    "dist": DIST_SCHEMAS,
    "logger": LOGGER_SCHEMAS,
}

_registered = False


def register() -> None:
    """Store every schema once: `<stage>_schema` for primaries, `data/<option>_schema` for options."""
    global _registered
    if _registered:
        return
    cs = ConfigStore.instance()
    for name, node in STAGE_SCHEMAS.items():
        cs.store(name=f"{name}_schema", node=node)
    for group, options in GROUP_SCHEMAS.items():
        for name, node in options.items():
            cs.store(group=group, name=f"{name}_schema", node=node)
    _registered = True


def eval_batch_size(train) -> int:
    """Seeds per evaluation batch: train.eval_batch_size, or at 0 the training batch size. Larger evaluation
    batches sample other neighbours, so their metrics would change with the memory a run has wherever a
    plan had to shrink them (capped vs uncapped runs)."""
    return int(train.eval_batch_size) or int(train.batch_size)
