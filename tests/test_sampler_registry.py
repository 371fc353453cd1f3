"""Every formation behind `sampler=` is complete: a registry entry, a schema, a config and a preset that composes."""

from __future__ import annotations

import pytest

from gnnscale.config.compose import config_dir
from gnnscale.config.schema import SAMPLER_SCHEMAS
from gnnscale.errors import ConfigError
from gnnscale.sampling import (
    PRESETS,
    SAMPLERS,
    build_eval_sampler,
    build_sampler,
    check_sampler_cfg,
    has_fanouts,
)
from tests.conftest import compose


def test_every_kind_has_a_schema_and_a_config():
    assert set(SAMPLERS) == set(SAMPLER_SCHEMAS)
    missing = [k for k in SAMPLERS if not (config_dir() / "sampler" / f"{k}.yaml").is_file()]
    assert missing == []


@pytest.mark.parametrize("kind", sorted(SAMPLER_SCHEMAS))
def test_each_kind_composes_and_builds(kind):
    cfg = compose("train", f"sampler={kind}")
    assert cfg.sampler.kind == kind
    check_sampler_cfg(cfg.sampler, int(cfg.model.num_layers))
    build_sampler(cfg.sampler, int(cfg.model.num_layers))
    evaluation = build_eval_sampler(cfg.sampler, int(cfg.model.num_layers))
    if not has_fanouts(cfg.sampler):  # subgraph formations are evaluated over every neighbour
        assert evaluation.fanouts == [-1] * int(cfg.model.num_layers)


@pytest.mark.parametrize("kind,preset", sorted(PRESETS.items()))
def test_each_formation_has_a_preset(kind, preset):
    cfg = compose("train", f"+exp={preset}")
    assert cfg.sampler.kind == kind


def test_unknown_kind_and_seed_order_are_refused():
    cfg = compose("train")
    cfg.sampler.kind = "bogus"
    with pytest.raises(ConfigError, match="sampler.kind='bogus'"):
        check_sampler_cfg(cfg.sampler, 2)
    cfg = compose("train", "sampler.seed_order=sorted")
    with pytest.raises(ConfigError, match="seed_order"):
        check_sampler_cfg(cfg.sampler, 2)


@pytest.mark.parametrize("kind", ["cluster_gcn", "saint", "full"])
def test_sampling_workers_with_a_subgraph_formation_are_refused_not_ignored(kind):
    from gnnscale.training.options import check_train_cfg

    check_train_cfg(compose("train", f"sampler={kind}"))
    with pytest.raises(ConfigError, match=f"train.num_workers=2 has no effect with sampler={kind}"):
        check_train_cfg(compose("train", f"sampler={kind}", "train.num_workers=2"))
