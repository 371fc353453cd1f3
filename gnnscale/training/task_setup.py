"""How the train stage tells the tasks apart: the task's name, its settings checked up front, the node task's
need for labels and its few-labels profile, and the link task's summary fields."""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from gnnscale.errors import ConfigError
from gnnscale.storage.meta import read_meta
from gnnscale.training.data import TrainData, load_link_data, load_train_data
from gnnscale.training.options import apply_few_labels
from gnnscale.utils.ui import info


def task_name(cfg: DictConfig) -> str:
    return str(OmegaConf.select(cfg, "task.name", default="node"))


def check_task(cfg: DictConfig) -> None:
    """The train.* settings, and task=link's, before any data is read (exit 2 with one line)."""
    from gnnscale.training.loggers import check_logger
    from gnnscale.training.options import check_train_cfg

    check_train_cfg(cfg)
    check_logger(cfg)
    if task_name(cfg) != "link":
        return
    from gnnscale.sampling.link import check_link_sampler
    from gnnscale.storage.edge_split import check_fractions
    from gnnscale.tasks.link import check_link_cfg

    check_link_cfg(cfg.task)
    check_fractions(float(cfg.task.val_fraction), float(cfg.task.test_fraction))
    check_link_sampler(str(cfg.sampler.kind))
    if float(cfg.task.get("hard_negatives", 0.0)) > 0 and cfg.sampler.kind == "cluster_gcn":
        raise ConfigError(
            "task.hard_negatives does not apply to sampler=cluster_gcn (its negatives are nodes of the batch's subgraph)",
            "set task.hard_negatives=0, or use sampler=neighbor",
        )
    if cfg.dist.kind != "none":
        raise ConfigError(f"task=link runs in one process (dist={cfg.dist.kind} given)", "use dist=none")


def needs_labels(graph_dir) -> None:
    """The node task on a graph sharded without labels: exit 2 naming task=link."""
    if int(read_meta(graph_dir)["num_classes"]) == 0:
        raise ConfigError(
            f"the node task needs labels but '{graph_dir}' has none",
            "train edge prediction on it with task=link, or shard it with labels (data.labels=...)",
        )


def link_summary(cfg: DictConfig, data, result) -> dict:
    """task=link: every link metric of the best weights on val and test, the edge split they used, and the
    test ranking metrics of common neighbours / Adamic-Adar / resource allocation / preferential attachment
    on the same negatives (`test_heuristics`), with one line when one ranks better than the model."""
    from gnnscale.tasks.link_metrics import LINK_METRICS
    from gnnscale.tasks.metrics import finite_or_none
    from gnnscale.tasks.pair_features import PAIR_FEATURES

    out = {"task": "link", "edge_split": data.edges.name, "eval_negatives": int(cfg.task.eval_negatives)}
    for split, scores in (("val", result.val), ("test", result.test)):
        for m in LINK_METRICS:
            out[f"{split}_{m}"] = finite_or_none(scores.get(m, float("nan")))
    heuristics = {
        h: {m: finite_or_none(result.test[f"{h}_{m}"]) for m in LINK_METRICS if f"{h}_{m}" in result.test}
        for h in PAIR_FEATURES
    }
    if any(heuristics.values()):
        out["test_heuristics"] = heuristics
        _say_if_heuristic_wins(cfg.task, out, heuristics)
    return out


def _say_if_heuristic_wins(task_cfg, out: dict, heuristics: dict) -> None:
    """Heuristics have ranks, no ROC-AUC: an auc-selected run is compared on MRR."""
    m = str(task_cfg.metric) if task_cfg.metric != "auc" else "mrr"
    model = out.get(f"test_{m}")
    best = max(heuristics, key=lambda h: heuristics[h].get(m) or -1.0)
    top = heuristics[best].get(m)
    if model is not None and top is not None and top > model:
        names = {
            "cn": "common neighbours",
            "aa": "Adamic-Adar",
            "ra": "resource allocation",
            "pa": "preferential attachment",
        }
        hint = (
            ""
            if task_cfg.get("pair_features")
            else "; task.pair_features=true gives the decoder these counts"
        )
        info(
            f"test {m}: {names[best]} alone ranks the held-out edges better than the model ({top:.4f} vs "
            f"{model:.4f}){hint}"
        )


def load_task_data(cfg: DictConfig) -> TrainData:
    """The task's training data: node labels and splits, or (task=link) the edge split and its graph."""
    degree = cfg.model.degree_feature
    if task_name(cfg) == "link":
        data = load_link_data(
            cfg.graph_dir, cfg.task, int(cfg.seed), int(cfg.model.hidden), cfg.verify, degree
        )
        check_held_out(data.edges, cfg.task)
        return data
    needs_labels(cfg.graph_dir)
    return load_train_data(cfg.graph_dir, verify=cfg.verify, degree_feature=degree)


def check_held_out(split, task_cfg) -> None:
    """task=link: an edge split that holds out no val and no test edge would train, pick best.pt on nothing
    and report "n/a": exit 2 instead, naming the counts and what would give it edges to score."""
    num_val, num_test = int(split.val.shape[1]), int(split.test.shape[1])
    if num_val or num_test:
        return
    source = (
        f"task.split_file={task_cfg.split_file}"
        if task_cfg.get("split_file")
        else f"task.val_fraction={task_cfg.val_fraction:g} and task.test_fraction={task_cfg.test_fraction:g}"
    )
    raise ConfigError(
        f"the edge split '{split.name}' holds out 0 validation and 0 test edges ({split.num_train:,} training "
        f"edges, from {source}): nothing to select the best epoch on or to score",
        "use a graph with more edges, raise task.val_fraction / task.test_fraction, or give "
        "task.split_file= a file that lists val and test edges",
    )


def few_labels_profile(cfg: DictConfig, data: TrainData) -> tuple[DictConfig, dict]:
    """The node task: train.few_labels in place when the train split is small, said in one line (task=link
    has no labelled split: nothing applies)."""
    if data.edges is not None:
        return cfg, {}
    num_train = len(data.splits["train"])
    cfg, applied, kept = apply_few_labels(cfg, num_train)
    if applied:
        below = cfg.train.few_labels.below
        info(
            f"few labelled training nodes ({num_train:,} < train.few_labels.below={below:,}): using "
            f"{' '.join(f'{k}={v}' for k, v in applied.items())}"
            f"{' (kept yours: ' + ' '.join(kept) + ')' if kept else ''} "
            "(change one with train.few_labels.<name>=VALUE, or turn them off with train.few_labels.below=0)"
        )
    return cfg, applied
