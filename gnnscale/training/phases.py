"""`train.phases`: a run in phases, each with its own batch size and fanouts.

A common schedule is coarse then fine: big batches over small neighbourhoods first (cheap epochs
while the weights move far), then small batches over large neighbourhoods. A phase is a span of
epochs; which phase an epoch belongs to depends on the epoch alone, so a resumed run lands in the
right phase without anything saved for it. Without train.phases a run is one phase of train.epochs
at train.batch_size and the sampler's own fanouts.

train.epochs and the phases: when phases are given the run's epochs are their sum. train.epochs set
on the command line must equal it (else exit 2); from a preset or the default it is replaced, and
config.yaml records the sum.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from omegaconf import DictConfig, OmegaConf

from gnnscale.errors import ConfigError


@dataclass(frozen=True)
class Phase:
    index: int  # 1-based
    start_epoch: int  # first epoch of the phase (1-based, inclusive)
    end_epoch: int  # last epoch (inclusive)
    batch_size: int
    fanouts: tuple[int, ...] | None  # None: the sampler's own (formations without fanouts, or not set)

    @property
    def epochs(self) -> int:
        return self.end_epoch - self.start_epoch + 1

    def describe(self) -> str:
        fan = f", fanouts {list(self.fanouts)}" if self.fanouts is not None else ""
        return f"epochs {self.start_epoch}-{self.end_epoch}: batch {self.batch_size}{fan}"


def _key(i: int, name: str) -> str:
    return f"train.phases[{i}].{name}"


def check_phases(cfg: DictConfig) -> None:
    """Each phase's epochs >= 1 and batch_size > 0; fanouts only for a formation with fanouts, one per
    layer; train.epochs given on the command line equals the phases' sum. Raises ConfigError."""
    from gnnscale.config.compose import overridden_keys
    from gnnscale.sampling import check_fanouts, has_fanouts

    phases = cfg.train.get("phases") or []
    if not phases:
        return
    layers = int(cfg.model.num_layers)
    for i, p in enumerate(phases):
        if OmegaConf.is_missing(p, "epochs"):
            raise ConfigError(
                f"{_key(i, 'epochs')} is missing", "give every phase its epochs, e.g. {epochs: 10}"
            )
        if int(p.epochs) < 1:
            raise ConfigError(f"{_key(i, 'epochs')}={p.epochs} must be at least 1", "use e.g. epochs: 10")
        if p.get("batch_size") is not None and int(p.batch_size) <= 0:
            raise ConfigError(
                f"{_key(i, 'batch_size')}={p.batch_size} must be positive",
                "use e.g. batch_size: 1024, or leave it out for train.batch_size",
            )
        if p.get("fanouts") is not None:
            if not has_fanouts(cfg.sampler):
                raise ConfigError(
                    f"{_key(i, 'fanouts')} is set but sampler.kind={cfg.sampler.kind} samples no fanouts",
                    "leave the phases' fanouts out, or choose a sampler with fanouts (e.g. sampler=neighbor)",
                )
            check_fanouts(p.fanouts, layers, key=_key(i, "fanouts"))
    total = sum(int(p.epochs) for p in phases)
    if "train.epochs" in overridden_keys(cfg) and int(cfg.train.epochs) != total:
        raise ConfigError(
            f"train.epochs={cfg.train.epochs} disagrees with train.phases, whose epochs add up to {total}",
            f"leave train.epochs out (the phases decide it) or set train.epochs={total}",
        )


def resolve_phases(cfg: DictConfig) -> list[Phase]:
    """The run's phases in order, defaults filled in (one phase of train.epochs without train.phases)."""
    t = cfg.train
    own = cfg.sampler.get("fanouts")
    default_fanouts = tuple(int(f) for f in own) if own is not None else None
    given = t.get("phases") or []
    if not given:
        return [Phase(1, 1, int(t.epochs), int(t.batch_size), default_fanouts)]
    phases, start = [], 1
    for i, p in enumerate(given):
        end = start + int(p.epochs) - 1
        bs = int(p.batch_size) if p.get("batch_size") is not None else int(t.batch_size)
        fan = tuple(int(f) for f in p.fanouts) if p.get("fanouts") is not None else default_fanouts
        phases.append(Phase(i + 1, start, end, bs, fan))
        start = end + 1
    return phases


def uses_phases(cfg: DictConfig) -> bool:
    return bool(cfg.train.get("phases"))


def resolve_epochs(cfg: DictConfig) -> DictConfig:
    """cfg with train.epochs = the phases' sum (a copy; cfg itself when no phases are given)."""
    if not uses_phases(cfg):
        return cfg
    total = resolve_phases(cfg)[-1].end_epoch
    if int(cfg.train.epochs) == total:
        return cfg
    cfg = cfg.copy()
    OmegaConf.update(cfg, "train.epochs", total, merge=False)
    return cfg


def phase_of(phases: Sequence[Phase], epoch: int) -> Phase:
    """The phase epoch belongs to (epochs past the last phase stay in it)."""
    for p in phases:
        if epoch <= p.end_epoch:
            return p
    return phases[-1]


def epoch_steps(phases: Sequence[Phase], steps_per_phase: Sequence[int]) -> list[int]:
    """Optimizer steps of every epoch (index 0 = epoch 1), from each phase's steps per epoch."""
    return [int(n) for p, n in zip(phases, steps_per_phase, strict=True) for _ in range(p.epochs)]
