"""Compose a stage's config with Hydra (no run folder, no logging) and turn its errors into one line."""

from __future__ import annotations

import os
import re
from importlib import resources
from pathlib import Path
from typing import Sequence

from omegaconf import DictConfig, OmegaConf

from gnnscale.config import schema
from gnnscale.errors import ConfigError


def config_dir() -> Path:
    """The configs folder: $GNNSCALE_CONFIG_DIR, else the one inside the package (checkout or wheel)."""
    override = os.environ.get("GNNSCALE_CONFIG_DIR")
    if override:
        return Path(override).resolve()
    return Path(str(resources.files("gnnscale") / "configs")).resolve()


def list_options(group: str) -> list[str]:
    folder = config_dir() / group
    return sorted(p.stem for p in folder.glob("*.yaml")) if folder.is_dir() else []


def compose_config(stage: str, overrides: Sequence[str] = ()) -> DictConfig:
    """Compose `configs/<stage>.yaml` with Hydra overrides; raise ConfigError with a one-line fix."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    schema.register()
    overrides = list(overrides)
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
            cfg = compose(config_name=stage, overrides=overrides)
    except Exception as exc:  # Hydra raises many exception types; all mean "bad config"
        raise _translate(exc, stage, overrides) from None
    finally:
        GlobalHydra.instance().clear()
    try:
        OmegaConf.resolve(cfg)
    except Exception as exc:
        raise ConfigError(
            f"cannot resolve the config: {_first_line(exc)}", "check the ${...} interpolations"
        ) from None
    if "cli_overrides" in cfg:
        cfg.cli_overrides = [o for o in overrides if "=" in o and not o.startswith("+exp=")]
    return cfg


def overridden_keys(cfg) -> set[str]:
    """The dotted keys the user set with key=value (or chose with group=option) when composing cfg."""
    return {o.split("=", 1)[0].lstrip("+~") for o in (cfg.get("cli_overrides") or [])}


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _valid_keys(stage: str, overrides: list[str], parent: str) -> list[str]:
    """The keys that exist under `parent` in the config composed with only the group choices."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    groups = [o for o in overrides if "=" in o and o.split("=", 1)[0].lstrip("+~") in _groups()]
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
            cfg = compose(config_name=stage, overrides=groups)
    except Exception:
        return []
    finally:
        GlobalHydra.instance().clear()
    node = OmegaConf.select(cfg, parent) if parent else cfg
    return sorted(node.keys()) if isinstance(node, DictConfig) else []


def _groups() -> set[str]:
    return {p.name for p in config_dir().iterdir() if p.is_dir()}


def _translate(exc: BaseException, stage: str, overrides: list[str]) -> ConfigError:
    chain = []
    e: BaseException | None = exc
    while e is not None:
        chain.append(str(e))
        e = e.__cause__ or e.__context__
    text = "\n".join(chain)

    m = re.search(r"Could not override '([^']+)'", text) or re.search(
        r"Could not append to config\. An item is already at '([^']+)'", text
    )
    key = m.group(1) if m else None
    if key is None:
        m = re.search(r"Key '([^']+)' not in '(\w+)'", text) or re.search(
            r"Key '([^']+)' is not in struct", text
        )
        if m:
            key = m.group(1)
    if "is not in struct" in text or "not in '" in text:
        m2 = re.search(r"full_key: ([\w.\[\]]+)", text)
        full = m2.group(1) if m2 else (key or "?")
        parent = full.rsplit(".", 1)[0] if "." in full else ""
        valid = _valid_keys(stage, overrides, parent)
        where = f"under '{parent}'" if parent else "at the top level"
        hint = (
            f"valid keys {where}: {', '.join(valid)}"
            if valid
            else f"see `gnnscale {stage.replace('_', '-')} --cfg`"
        )
        return ConfigError(f"unknown config key '{full}'", hint)
    m = re.search(r"Value '([^']*)' (?:of type '[^']*' )?could not be converted to (\w+)", text) or re.search(
        r"Value '([^']*)' is not a valid (\w+)", text
    )
    if m:
        m2 = re.search(r"full_key: ([\w.\[\]]+)", text)
        full = m2.group(1) if m2 else (key or "?")
        return ConfigError(
            f"config key '{full}' expects {m.group(2).lower()}, got '{m.group(1)}'", "fix the value's type"
        )
    m = re.search(r"Could not find '([^']+)'", text)
    if m:
        missing = m.group(1)
        group = missing.split("/")[0]
        options = list_options(group)
        if options:
            return ConfigError(
                f"unknown option '{missing.replace('/', '=', 1)}'",
                f"choose one of {group}={'|'.join(options)}",
            )
        return ConfigError(f"unknown config '{missing}'", "check the group name and spelling")
    m = re.search(r"Missing mandatory value: ([\w.]+)", text)
    if m:
        return ConfigError(f"config key '{m.group(1)}' must be set", f"add {m.group(1)}=VALUE")
    if "mismatched input" in text or "no viable alternative" in text or "Error parsing override" in text:
        bad = next((o for o in overrides if o in text), " ".join(overrides))
        return ConfigError(
            f"cannot parse override '{bad}'", "write overrides as key=value, group=option or +exp=NAME"
        )
    return ConfigError(
        f"invalid config: {_first_line(exc)}", f"see `gnnscale {stage.replace('_', '-')} --help`"
    )
