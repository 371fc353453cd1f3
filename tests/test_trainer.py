"""The trainer on its own seams: a stub batch source and a stub task, and Batch through BatchStream."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from gnnscale.models import build_model, model_signature
from gnnscale.models.checkpoint import read_checkpoint
from gnnscale.sampling.batch import Batch
from gnnscale.sampling.neighbor import NeighborBlockSampler
from gnnscale.storage.csc import open_csc
from gnnscale.storage.run_dir import checkpoint_file, read_metrics
from gnnscale.training.batches import BatchStream
from gnnscale.training.data import load_train_data
from gnnscale.training.precision import Precision
from gnnscale.training.seeding import reseed
from gnnscale.training.trainer import Callback, Trainer, TrainerSettings
from tests.conftest import TINY_SYNTHETIC, build_graph, compose


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return load_train_data(str(build_graph(tmp_path_factory.mktemp("tiny"), *TINY_SYNTHETIC)))


class FullNeighbourSource:
    """A batch source without DGL's DataLoader: every in-neighbour, seeds shuffled by numpy."""

    def __init__(self, g, seeds: torch.Tensor, batch_size: int, shuffle: bool):
        self.g, self.seeds, self.bs, self.shuffle = g, seeds, batch_size, shuffle
        # gnnscale's relabelling: DGL's multi-threaded to_block numbers sources differently every run.
        self.sampler = NeighborBlockSampler([-1, -1])

    def __iter__(self):
        order = np.random.permutation(len(self.seeds)) if self.shuffle else np.arange(len(self.seeds))
        for lo in range(0, len(order), self.bs):
            seeds = self.seeds[torch.from_numpy(order[lo : lo + self.bs])]
            input_nodes, _, blocks = self.sampler.sample_blocks(self.g, seeds)
            yield Batch(input_nodes, seeds, blocks=blocks)


class Regression:
    """A stub task: squared error to a fixed per-node target; its metric is the negative error."""

    metric = "neg_mse"
    metric_names = ("neg_mse", "loss")

    def __init__(self, target: torch.Tensor):
        self.target = target

    def build_model(self, model_cfg, in_dim: int):
        return build_model(model_cfg, in_dim, 1)

    def loss(self, out, b):
        return F.mse_loss(b.outputs(out)[:, 0], self.target[b.seeds])

    def num_scored(self, b) -> int:
        return len(b.seeds)

    def correct(self, out, b) -> int:
        return 0

    def collect(self, out, b):
        return out[:, 0].detach(), self.target[b.seeds]

    def score(self, collected):
        if not collected:
            return {"neg_mse": float("nan"), "loss": float("nan")}
        mse = float(F.mse_loss(torch.cat([c[0] for c in collected]), torch.cat([c[1] for c in collected])))
        return {"neg_mse": -mse, "loss": mse}


class Recorder(Callback):
    def __init__(self, stop_after: int | None = None):
        self.batches, self.epochs, self.stop_after = [], [], stop_after

    def on_batch_end(self, epoch, end):
        self.batches.append((epoch, end.step, sorted(end.times)))

    def on_epoch_end(self, record):
        self.epochs.append(record["epoch"])
        if record["epoch"] == self.stop_after:
            raise KeyboardInterrupt  # a kill after the epoch's checkpoint was written


def make_trainer(data, run_dir, epochs: int, init_seed: int, callbacks=()):
    cfg = compose("train", "model.hidden=16", "model.dropout=0.0")
    # The target mixes each node's neighbours' features: only message passing can fit it.
    g = data.g
    x = data.features.gather(torch.arange(data.graph.num_nodes))
    indptr, indices = open_csc(data.graph)
    deg = torch.from_numpy(np.diff(indptr))
    dst = torch.repeat_interleave(torch.arange(len(x)), deg)
    neigh = torch.zeros(len(x)).index_add_(0, dst, x[torch.from_numpy(np.asarray(indices)), 0])
    target = neigh / deg.clamp(min=1)
    task = Regression(target)
    reseed(init_seed)
    model = task.build_model(cfg.model, data.feat_dim)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)

    def stream(split, train):
        ids = data.splits[split]
        n = -(-len(ids) // 64)
        return BatchStream(
            lambda: FullNeighbourSource(g, ids, 64, train), data.features, None, prefetch=0, num_batches=n
        )

    streams = {"train": stream("train", True), "val": stream("val", False), "test": stream("test", False)}
    signature = model_signature(cfg.model, data.feat_dim, 1)
    identity = {"signature": signature, "model_cfg": {}, "graph": {}, "config_hash": "stub"}
    settings = TrainerSettings(epochs=epochs, seed=3)
    return Trainer(
        model, task, optimizer, scheduler, Precision("fp32", torch.device("cpu")), streams, run_dir,
        settings, identity, callbacks,
    )  # fmt: skip


def test_trainer_with_stub_source_and_task_learns(tmp_path, data):
    rec = Recorder()
    trainer = make_trainer(data, tmp_path, epochs=6, init_seed=0, callbacks=[rec])
    result = trainer.fit()
    losses = [r["loss"] for r in result.records]
    assert len(losses) == 6 and losses[-1] < 0.5 * losses[0]
    assert result.val["neg_mse"] > result.records[0]["val_neg_mse"]
    assert result.test["loss"] == pytest.approx(-result.test["neg_mse"])
    # Every batch reached the hook with its time split; every epoch its record and its checkpoint.
    steps_per_epoch = -(-len(data.splits["train"]) // 64)
    assert len(rec.batches) == 6 * steps_per_epoch
    assert rec.batches[0][2] == sorted(
        ["sample_s", "gather_s", "data_wait_s", "forward_s", "backward_s", "step_s"]
    )
    assert rec.epochs == [1, 2, 3, 4, 5, 6]
    assert [r["epoch"] for r in read_metrics(tmp_path)] == [1, 2, 3, 4, 5, 6]
    assert read_checkpoint(checkpoint_file(tmp_path))["epoch"] == 6


def test_trainer_resume_after_epoch_1_equals_uninterrupted(tmp_path, data):
    full = make_trainer(data, tmp_path / "full", epochs=3, init_seed=0)
    full_result = full.fit()

    cut = make_trainer(data, tmp_path / "cut", epochs=3, init_seed=0, callbacks=[Recorder(stop_after=1)])
    with pytest.raises(KeyboardInterrupt):
        cut.fit()
    # Another initialisation: everything that matters must come from the checkpoint.
    resumed = make_trainer(data, tmp_path / "cut", epochs=3, init_seed=99)
    assert resumed.restore() is True and resumed.resumed_from == 1
    result = resumed.fit()

    def computed(records):
        return [{k: r[k] for k in ("epoch", "loss", "val_neg_mse", "val_loss", "steps")} for r in records]

    assert computed(result.records) == computed(full_result.records)
    assert result.test == {**full_result.test, "time_s": result.test["time_s"]}
    a = read_checkpoint(checkpoint_file(tmp_path / "full"))
    b = read_checkpoint(checkpoint_file(tmp_path / "cut"))
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key
    steps = [s["step"] for s in a["optimizer"]["state"].values()]
    assert steps == [s["step"] for s in b["optimizer"]["state"].values()]
    assert int(steps[0]) == 3 * -(-len(data.splits["train"]) // 64)  # no extra optimizer step


@pytest.mark.parametrize("prefetch", [0, 2])
def test_batch_round_trips_through_batchstream(data, prefetch):
    """BatchStream fills x and y and keeps every field the source set, in the source's order."""
    ids = data.splits["train"]
    made = []

    def source():
        for lo in range(0, len(ids), 50):
            seeds = ids[lo : lo + 50]
            extra = torch.arange(lo, lo + 7)  # a few more input nodes than seeds
            b = Batch(
                torch.cat([seeds, extra]),
                seeds,
                subgraph="sg",
                output_rows=torch.arange(len(seeds)),
                loss_weight=torch.full((len(seeds),), 0.5),
                pos_pairs=torch.stack([seeds, seeds]),
                neg_pairs=torch.stack([seeds, seeds.flip(0)]),
            )
            made.append(b)
            yield b

    stream = BatchStream(source, data.features, data.labels, prefetch=prefetch)
    got = []
    for b in stream:  # x lives in a ring of reused buffers: check it while the batch is current
        assert torch.equal(b.x, data.features.gather(b.input_nodes).float())
        got.append(b)
    stream.close()
    assert len(got) == len(made) == -(-len(ids) // 50)
    for b, m in zip(got, made, strict=True):
        assert b is m  # the same object: nothing the source set is dropped or copied
        assert torch.equal(b.y, data.labels[b.seeds])
        assert b.layers(2) == ["sg", "sg"]
        assert torch.equal(b.outputs(torch.arange(len(b.input_nodes))), torch.arange(len(b.seeds)))
        assert b.sample_s >= 0 and b.gather_s >= 0
