"""The trainer: epochs, evaluation, early stopping, checkpoints and exact resume, metrics, the time split.

What it trains on comes in as pieces (model, task, optimizer, scheduler, precision, batch streams), so
a formation, a task or a distributed mode changes a piece, not this loop. Callbacks see every batch's
end (with its time split) and every epoch's record: progress bars, diagnostics and profiling attach
there. Every epoch reseeds all RNGs from (seed, epoch), so a run resumed from checkpoints/last.pt
repeats the uninterrupted run exactly. With train.phases the "train" stream is a list, one per phase;
the epoch alone picks the phase (training/phases.py), so a resumed run lands in the right one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import torch

from gnnscale.errors import GnnscaleError
from gnnscale.models.checkpoint import check_signature, read_checkpoint, save_checkpoint
from gnnscale.storage.run_dir import (
    BEST,
    LAST,
    append_metrics,
    checkpoint_file,
    read_metrics,
    truncate_metrics,
)
from gnnscale.tasks.metrics import finite_or_none
from gnnscale.training.loop import BatchEnd, evaluate, train_epoch
from gnnscale.training.phases import Phase, phase_of
from gnnscale.training.seeding import epoch_seed, reseed, rng_state, set_rng_state
from gnnscale.training.sync import SINGLE, Sync
from gnnscale.utils.faults import fault_point
from gnnscale.utils.ui import info, is_rank_zero

# Seed streams of an epoch: training uses stream 0, validation 1; the final val / test passes 2 and 3.
_EVAL_STREAM, _TEST_STREAM = 1, 2


class TrainingDiverged(GnnscaleError):
    """A non-finite training loss: the run stops before saving the epoch; best.pt / last.pt stay as they were.
    Exit 2 like other user-fixable settings (train.lr, train.grad_clip, precision), not a gnnscale bug."""


class TrainingInterrupted(GnnscaleError):
    """Ctrl-C (SIGINT): the last completed epoch is in last.pt; exit 130, the shell's code for SIGINT."""

    exit_code = 130


@dataclass
class TrainerSettings:
    epochs: int
    seed: int
    eval_every: int = 1
    patience: int = 0  # epochs without a better val metric before stopping; 0 = never
    grad_clip: float = 0.0
    input_dropout: float = 0.0
    # train.phases resolved (training/phases.py); empty = one phase, no phase fields in the records.
    # Early stopping waits for the last phase: a coarse phase's plateau is no reason to skip the rest.
    phases: Sequence[Phase] = ()


class Callback:
    """Hooks into the loop; every method is optional."""

    wants_grad_norm = False  # BatchEnd.grad_norm is filled (computed when not clipping) if any wants it

    def on_resume(self, records: list[dict]) -> None:
        """The metrics lines of the epochs a resumed run keeps (called by Trainer.restore)."""

    def on_epoch_start(self, epoch: int, num_batches: int) -> None: ...

    def on_batch_end(self, epoch: int, end: BatchEnd) -> None: ...

    def on_epoch_record(self, epoch: int, record: dict, model) -> None:
        """Before the record is written to metrics.jsonl: what is added to it is logged with it."""

    def on_epoch_end(self, record: dict) -> None: ...

    def on_stop(self, reason: str) -> None: ...

    def on_fit_end(self, result: FitResult) -> None:
        """After the best weights were scored on val and test (a resumed run with no epochs left too)."""

    def close(self) -> None:
        """The run ends, finished or not (Trainer.close): let go of open files."""


@dataclass
class FitResult:
    records: list[dict]  # every epoch's metrics line, those before a resume included
    best_val: float
    best_epoch: int
    stopped: bool
    resumed_from: int | None
    val: dict  # the best weights' metrics on the val / test splits
    test: dict
    checkpoint: Path
    extra: dict = field(default_factory=dict)


class Trainer:
    def __init__(
        self,
        model,
        task,
        optimizer,
        scheduler,
        precision,
        streams: dict,  # "train", "val", "test" -> BatchStream
        run_dir: Path,
        settings: TrainerSettings,
        identity: dict,  # what the checkpoint says the weights are: signature, model_cfg, graph, config_hash
        callbacks: Sequence[Callback] = (),
        peak_rss_mb: Callable[[], float | None] = lambda: None,
        sync: Sync = SINGLE,
    ):
        self.model, self.task, self.sync = model, task, sync
        self.optimizer, self.scheduler, self.precision = optimizer, scheduler, precision
        self.streams, self.run_dir, self.s = streams, Path(run_dir), settings
        self.identity = identity
        self.callbacks = list(callbacks)
        self.peak_rss_mb = peak_rss_mb
        if is_rank_zero():
            self.run_dir.mkdir(parents=True, exist_ok=True)
        self.start_epoch, self.best_val, self.best_epoch = 1, float("nan"), 0
        self.stopped, self.resumed_from = False, None
        self.saved_epoch: int | None = None  # the last epoch whose last.pt is on disk
        self.epoch = 0  # the epoch running now

    @property
    def has_val(self) -> bool:
        return len(self.streams["val"]) > 0

    # ------------------------------------------------------------ checkpoints
    def _state(self, epoch: int) -> dict:
        return {
            "model": self.model.state_dict(),
            **self.identity,
            "epoch": epoch,
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.precision.scaler.state_dict(),
            "rng": rng_state(),
            "best_val": self.best_val,
            "best_epoch": self.best_epoch,
            "metric": self.task.metric,
            "stopped": self.stopped,
        }

    def restore(self) -> bool:
        """Continue from run_dir's last.pt; True if its config hash equals this run's."""
        path = checkpoint_file(self.run_dir, LAST)
        ckpt = read_checkpoint(path)
        check_signature(ckpt, self.identity["signature"], path)
        self.model.load_state_dict(ckpt["model"])
        self.optimizer.load_state_dict(ckpt["optimizer"])
        self.scheduler.load_state_dict(ckpt["scheduler"])
        self.precision.scaler.load_state_dict(ckpt["scaler"])
        set_rng_state(ckpt["rng"])
        self.resumed_from = self.saved_epoch = int(ckpt["epoch"])
        self.start_epoch = self.resumed_from + 1
        self.best_val, self.best_epoch = float(ckpt["best_val"]), int(ckpt["best_epoch"])
        self.stopped = bool(ckpt.get("stopped", False))
        if is_rank_zero():
            truncate_metrics(self.run_dir, self.resumed_from)
        self.sync.barrier()
        kept = read_metrics(self.run_dir)
        for cb in self.callbacks:
            cb.on_resume(kept)
        return ckpt.get("config_hash") == self.identity.get("config_hash")

    # ------------------------------------------------------------ phases
    def phase(self, epoch: int) -> Phase | None:
        return phase_of(self.s.phases, epoch) if self.s.phases else None

    def train_stream(self, epoch: int):
        """The epoch's training stream: its phase's when "train" holds one per phase."""
        streams = self.streams["train"]
        if not isinstance(streams, (list, tuple)):
            return streams
        phase = self.phase(epoch)
        return streams[phase.index - 1 if phase is not None else 0]

    def _say_phase(self, epoch: int, phase: Phase | None) -> None:
        if phase is None or not (epoch == phase.start_epoch or epoch == self.start_epoch):
            return
        verb = "starts" if epoch == phase.start_epoch else "continues"
        info(f"phase {phase.index}/{len(self.s.phases)} {verb} at epoch {epoch} ({phase.describe()})")

    # ------------------------------------------------------------ the loop
    def _validate(self, epoch: int, record: dict) -> bool:
        """Validation metrics into record; True if they are the best so far."""
        metric = self.task.metric
        if not self.has_val:
            self.best_epoch = epoch  # no validation split: the latest weights are the best we know
            return True
        if epoch % self.s.eval_every and epoch != self.s.epochs:
            return False
        reseed(self._seed(epoch, _EVAL_STREAM))
        val = evaluate(self.model, self.streams["val"], self.task, self.precision, self.sync)
        record.update(
            {
                f"val_{metric}": finite_or_none(val[metric]),
                "val_loss": finite_or_none(val["loss"]),
                "eval_time_s": round(val["time_s"], 4),
            }
        )
        better = not math.isnan(val[metric]) and (math.isnan(self.best_val) or val[metric] > self.best_val)
        if better:
            self.best_val, self.best_epoch = float(val[metric]), epoch
        return better

    def _seed(self, epoch: int, stream: int = 0) -> int:
        return epoch_seed(self.s.seed, epoch, stream, self.sync.rank)

    def _epoch(self, epoch: int) -> dict:
        self.epoch = epoch
        reseed(self._seed(epoch))
        phase = self.phase(epoch)
        self._say_phase(epoch, phase)
        stream = self.train_stream(epoch)
        for cb in self.callbacks:
            cb.on_epoch_start(epoch, len(stream))

        def on_batch(end: BatchEnd) -> None:
            for cb in self.callbacks:
                cb.on_batch_end(epoch, end)
            fault_point("train.batch")

        stats = train_epoch(
            self.model,
            stream,
            self.task,
            self.optimizer,
            self.scheduler,
            self.precision,
            grad_clip=self.s.grad_clip,
            input_dropout=self.s.input_dropout,
            on_batch=on_batch if self.callbacks else None,
            grad_norm=any(cb.wants_grad_norm for cb in self.callbacks),
            sync=self.sync,
        )
        if not math.isfinite(stats["loss"]) or fault_point("train.epoch") == "nan":
            raise self._diverged(epoch, stats["loss"])
        record = {
            "epoch": epoch,
            "loss": round(stats["loss"], 6),
            "train_acc": round(stats["train_acc"], 6),
            "lr": self.scheduler.get_last_lr()[0],
        }
        improved = self._validate(epoch, record)
        record.update({k: round(v, 4) for k, v in stats.items() if k.endswith("_s")})
        peak = self.peak_rss_mb()
        record.update(
            {
                "seeds_per_s": round(stats["seeds_per_s"], 1),
                "steps": stats["steps"],
                "input_nodes_per_batch": round(stats["input_nodes_per_batch"], 1),
                "peak_rss_mb": round(peak, 1) if peak is not None else None,
                "best": improved,
                **self.sync.epoch_stats(),
            }
        )
        device = next(self.model.parameters()).device
        if device.type == "cuda":
            record["peak_gpu_mb"] = round(torch.cuda.max_memory_allocated(device) / 2**20, 1)
        if phase is not None:
            record["phase"] = phase.index
            record["batch_size"] = phase.batch_size
            record["fanouts"] = list(phase.fanouts) if phase.fanouts is not None else None
        self.stopped = self._should_stop(epoch, phase)
        for cb in self.callbacks:
            cb.on_epoch_record(epoch, record, self.model)
        if is_rank_zero():
            append_metrics(self.run_dir, record)
            last = checkpoint_file(self.run_dir, LAST)
            save_checkpoint(
                [checkpoint_file(self.run_dir, BEST), last] if improved else last, self._state(epoch)
            )
        self.saved_epoch = epoch
        self.sync.barrier()  # no rank reads best.pt / last.pt before rank 0 has written them
        return record

    def _diverged(self, epoch: int, loss: float) -> TrainingDiverged:
        best = checkpoint_file(self.run_dir, BEST)
        kept = (
            f"{best} (epoch {self.best_epoch}) is kept and usable"
            if best.is_file()
            else "no checkpoint was saved"
        )
        lr = self.optimizer.param_groups[0]["lr"]
        clip = (
            f"train.grad_clip=1.0 (now {self.s.grad_clip:g})"
            if self.s.grad_clip <= 0
            else "a smaller train.grad_clip"
        )
        fp32 = "" if self.precision.name == "fp32" else f", or precision=fp32 (now {self.precision.name})"
        return TrainingDiverged(
            f"training diverged in epoch {epoch}: the training loss is {loss}; {kept}",
            f"try a lower train.lr (it was {lr:g}), {clip}{fp32}",
        )

    def interrupted(self) -> TrainingInterrupted:
        """Ctrl-C's one line: which epoch was lost, and the command that continues the run."""
        if self.saved_epoch is None:
            return TrainingInterrupted(
                f"interrupted in epoch {self.epoch or 1} before any epoch was saved",
                "nothing to resume; run the same command again",
            )
        return TrainingInterrupted(
            f"interrupted in epoch {self.epoch}; epochs 1-{self.saved_epoch} are saved in "
            f"{checkpoint_file(self.run_dir, LAST)}",
            f"continue with `gnnscale train resume={self.run_dir}`",
        )

    def _should_stop(self, epoch: int, phase: Phase | None) -> bool:
        """Patience runs out; with phases, only in the last phase and counted from its start."""
        if not (self.has_val and self.s.patience > 0):
            return False
        since = self.best_epoch
        if phase is not None:
            if phase.index < len(self.s.phases):
                return False
            since = max(since, phase.start_epoch - 1)
        return epoch - since >= self.s.patience

    def fit(self) -> FitResult:
        """Train the remaining epochs, then score the best-validation weights on val and test. Ctrl-C
        propagates (KeyboardInterrupt); a stage turns it into self.interrupted()'s one line."""
        history = []
        for epoch in range(self.start_epoch, int(self.s.epochs) + 1):
            if self.stopped:
                break
            record = self._epoch(epoch)
            history.append(record)
            for cb in self.callbacks:
                cb.on_epoch_end(record)
            if self.stopped:
                reason = (
                    f"no better val_{self.task.metric} for {self.s.patience} epochs "
                    f"(best {self.best_val:.4f} at epoch {self.best_epoch})"
                )
                for cb in self.callbacks:
                    cb.on_stop(reason)
        best = checkpoint_file(self.run_dir, BEST)
        if best.is_file():
            self.model.load_state_dict(read_checkpoint(best)["model"])
        # Scored under fixed seeds: the same after any resume.
        reseed(self._seed(0, _TEST_STREAM))
        val = (
            evaluate(self.model, self.streams["val"], self.task, self.precision, self.sync)
            if self.has_val
            else {self.task.metric: float("nan")}
        )
        reseed(self._seed(0, _TEST_STREAM + 1))
        test = evaluate(self.model, self.streams["test"], self.task, self.precision, self.sync)
        result = FitResult(
            records=read_metrics(self.run_dir) or history,
            best_val=self.best_val,
            best_epoch=self.best_epoch,
            stopped=self.stopped,
            resumed_from=self.resumed_from,
            val=val,
            test=test,
            checkpoint=best if best.is_file() else checkpoint_file(self.run_dir, LAST),
        )
        for cb in self.callbacks:
            cb.on_fit_end(result)
        return result

    def close(self) -> None:
        for s in self.streams.values():
            for stream in s if isinstance(s, (list, tuple)) else [s]:
                stream.close()
        for cb in self.callbacks:  # after the streams: their sampler threads stop whatever a callback does
            cb.close()
