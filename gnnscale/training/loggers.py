"""What a train run writes for people to look at (the `logger` config group), as trainer callbacks.

metrics.jsonl is the trainer's own record and is always written: resume and summary.json read it. On top
of it, logger=jsonl (the default) keeps run_dir/curves.png drawn from it, logger=tensorboard adds event
files under run_dir/tb/, logger=none adds nothing. Only rank 0 writes: the records are every rank's.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from gnnscale.errors import ConfigError
from gnnscale.storage.run_dir import read_metrics
from gnnscale.training.curves import CURVES_FILE, draw_curves
from gnnscale.training.loop import TIME_SPLIT, BatchEnd
from gnnscale.training.trainer import Callback, FitResult

LOGGERS = ("jsonl", "tensorboard", "none")
TB_DIR, TB_BATCHES = "tb", "batches"
# A picture costs a fraction of a second: redrawn after an epoch only when this long has passed since the
# last one, so short epochs are not slowed and a long run's picture is never older than about this.
REFRESH_S = 30.0


def _settings(cfg: DictConfig) -> tuple[str, int]:
    opts = cfg.get("logger") or {}
    return str(opts.get("kind", "jsonl")), int(opts.get("every_n_batches", 0))


def check_logger(cfg: DictConfig) -> None:
    """logger.* before any data is read (exit 2 with one line), the tensorboard package included."""
    kind, every = _settings(cfg)
    if kind not in LOGGERS:
        raise ConfigError(f"logger.kind={kind} is not a logger", f"choose logger={'|'.join(LOGGERS)}")
    if every < 0:
        raise ConfigError(
            f"logger.every_n_batches={every} is negative",
            "give a batch count, or 0 for per-epoch values only",
        )
    if kind == "tensorboard":
        _summary_writer()


def _summary_writer():
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise ConfigError(
            "logger=tensorboard needs the tensorboard package, which is not installed",
            "run `make install` (or pip install tensorboard), or choose logger=jsonl",
        ) from None
    return SummaryWriter


def build_loggers(cfg: DictConfig, run_dir: Path, metric: str, title: str, rank: int) -> list[Callback]:
    """The callbacks for cfg.logger (checked by check_logger): rank 0's; none on the other ranks."""
    kind, every = _settings(cfg)
    if rank != 0 or kind == "none":
        return []
    loggers: list[Callback] = [CurvesPicture(run_dir, metric, title)]
    if kind == "tensorboard":
        clipped = float(cfg.train.grad_clip) > 0  # clipping computes the gradient norm anyway
        loggers.append(TensorBoardLogger(run_dir / TB_DIR, every, hparams_of(cfg), clipped))
    return loggers


class CurvesPicture(Callback):
    """run_dir/curves.png from metrics.jsonl: refreshed during the run, drawn once more at its end."""

    def __init__(self, run_dir: Path, metric: str, title: str, refresh_s: float = REFRESH_S):
        self.run_dir, self.metric, self.title, self.refresh_s = Path(run_dir), metric, title, refresh_s
        self.drawn_at = time.monotonic()
        self.final = False

    def draw(self) -> None:
        records = read_metrics(self.run_dir)
        if records:
            draw_curves(self.run_dir / CURVES_FILE, records, self.metric, self.title)
        self.drawn_at = time.monotonic()

    def on_epoch_end(self, record: dict) -> None:
        if time.monotonic() - self.drawn_at >= self.refresh_s:
            self.draw()

    def on_fit_end(self, result: FitResult) -> None:
        self.draw()
        self.final = True

    def close(self) -> None:
        if self.final:
            return
        try:  # a run that stopped early (diverged, interrupted) still leaves its picture
            self.draw()
        except Exception:  # noqa: BLE001 - a picture must not hide why the run stopped
            pass


class TensorBoardLogger(Callback):
    """Event files: every numeric field of each epoch's metrics line (step = epoch) and, at the end, the
    hyper-parameters with the final metrics (HParams); in tb/batches/ the batch loss and gradient norm
    every `every` batches (step = batches trained so far).

    A resumed run must not show an epoch twice, nor lose one whose events were never flushed: its writer
    hides every earlier epoch event (purge_step=1) and writes the epochs metrics.jsonl kept again; the
    batch writer hides the batches past the kept epochs."""

    def __init__(self, path: Path, every: int, hparams: dict, grad_norm_free: bool):
        self.writer_class, self.path, self.every = _summary_writer(), Path(path), every
        self.hparams = hparams
        # Asked for only where clipping computes it anyway (else logged when the diagnostics ask for it).
        self.wants_grad_norm = grad_norm_free and every > 0
        self.kept: list[dict] | None = None  # the epochs a resumed run keeps; None = a fresh run
        self.step = 0  # batches trained so far, over the whole run
        self.epochs = self.batches = None

    def on_resume(self, records: list[dict]) -> None:
        self.kept = list(records)
        self.step = sum(int(r.get("steps") or 0) for r in records)

    def _open(self) -> None:
        if self.epochs is not None:
            return
        resumed = self.kept is not None
        if not resumed:  # overwrite=true replaced an earlier run here: its events go with it
            shutil.rmtree(self.path, ignore_errors=True)
        self.epochs = self.writer_class(str(self.path), purge_step=1 if resumed else None)
        for record in self.kept or []:
            self._log_epoch(record)
        if self.every:
            self.batches = self.writer_class(
                str(self.path / TB_BATCHES), purge_step=self.step + 1 if resumed else None
            )

    def on_epoch_start(self, epoch: int, num_batches: int) -> None:
        self._open()

    def on_batch_end(self, epoch: int, end: BatchEnd) -> None:
        self.step += 1
        if self.batches is None or self.step % self.every:
            return
        self.batches.add_scalar("batch/loss", end.loss, self.step)
        if end.grad_norm is not None:
            self.batches.add_scalar("batch/grad_norm", end.grad_norm, self.step)

    def _log_epoch(self, record: dict) -> None:
        for key, value in record.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool) and key != "epoch":
                self.epochs.add_scalar(scalar_tag(key), value, int(record["epoch"]))

    def on_epoch_end(self, record: dict) -> None:
        self._open()
        self._log_epoch(record)
        for writer in (self.epochs, self.batches):
            if writer is not None:
                writer.flush()  # a killed run's event files hold what its metrics.jsonl holds

    def on_fit_end(self, result: FitResult) -> None:
        from torch.utils.tensorboard.summary import hparams

        self._open()
        final = {
            f"final/{split}_{k}": float(v)
            for split, scores in (("val", result.val), ("test", result.test))
            for k, v in scores.items()
            if k != "time_s" and isinstance(v, (int, float)) and v == v  # NaN: no such split
        }
        last = max((int(r["epoch"]) for r in result.records), default=0)
        if final:
            for summary in hparams(self.hparams, final):
                self.epochs.file_writer.add_summary(summary)
            for tag, value in final.items():
                self.epochs.add_scalar(tag, value, last)
        self.epochs.flush()

    def close(self) -> None:
        for writer in (self.epochs, self.batches):
            if writer is not None:
                writer.close()
        self.epochs = self.batches = None


_TIMES = set(TIME_SPLIT) | {"epoch_time_s", "epoch_cpu_s", "eval_time_s"}


def scalar_tag(key: str) -> str:
    """A metrics.jsonl field's TensorBoard tag, grouped into sections (train/, val/, time/, ...)."""
    if key in ("loss", "lr"):
        return f"train/{key}"
    if key == "train_acc":
        return "train/acc"
    for prefix in ("val_", "test_", "diag_", "cache_", "comm_"):
        if key.startswith(prefix):
            return f"{prefix[:-1]}/{key[len(prefix) :]}"
    if key in _TIMES:
        return f"time/{key}"
    if key.startswith("peak_"):
        return f"memory/{key}"
    if key in ("seeds_per_s", "input_nodes_per_batch", "steps"):
        return f"throughput/{key}"
    return f"run/{key}"


def hparams_of(cfg: DictConfig) -> dict:
    """The settings the HParams view lists: model, sampler, task, precision and train.*, flattened."""
    out = {"seed": int(cfg.seed)}
    for section in ("task", "model", "sampler", "precision", "train"):
        node = cfg.get(section)
        if node is None:
            continue
        for key, value in _flatten(OmegaConf.to_container(node, resolve=True), section).items():
            if value is None or key == "train.resume":  # resume: how the run started, not what it trained
                continue
            out[key] = value if isinstance(value, (bool, int, float, str)) else str(value)
    return out


def _flatten(node, prefix: str) -> dict:
    if not isinstance(node, dict):
        return {prefix: node}
    out = {}
    for key, value in node.items():
        out.update(_flatten(value, f"{prefix}.{key}"))
    return out
