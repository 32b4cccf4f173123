"""Experiment YAML files: composition by ``__base__`` and deep merge.

A variant file names its base (relative to itself) and states only what differs::

    __base__: base.yaml
    model:
      interface:
        class_path: fixed_embed.interfaces.GF2CodeInput

Merging is recursive for mappings, except that a mapping whose ``class_path`` changes is
replaced whole (the old class's ``init_args`` would not fit the new class).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

__all__ = ["DEFAULT_RUN", "deep_merge", "expand_config_args", "load_experiment"]

BASE_KEY = "__base__"
DEFAULT_RUN = "default"  # the run name without --run: its folder is <save_dir>/<logger name>/default/


def deep_merge(base: Any, override: Any) -> Any:
    if not (isinstance(base, dict) and isinstance(override, dict)):
        return override
    if "class_path" in override and override.get("class_path") != base.get("class_path"):
        return override
    merged = dict(base)
    for key, value in override.items():
        merged[key] = deep_merge(base[key], value) if key in base else value
    return merged


def load_experiment(path: str | Path, _seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """The experiment at ``path`` with its ``__base__`` chain merged in (base first)."""
    path = Path(path).resolve()
    if not path.is_file():
        raise FileNotFoundError(f"experiment config not found: {path}")
    if path in _seen:
        raise ValueError(f"__base__ cycle: {' -> '.join(str(p) for p in (*_seen, path))}")
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path} must hold a YAML mapping, got {type(data).__name__}")
    bases = data.pop(BASE_KEY, [])
    merged: dict[str, Any] = {}
    for base in [bases] if isinstance(bases, str) else bases:
        merged = deep_merge(merged, load_experiment(path.parent / base, (*_seen, path)))
    return deep_merge(merged, data)


def _uses_base(path: str) -> bool:
    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError):
        return False
    return isinstance(data, dict) and BASE_KEY in data


def expand_config_args(args: list[str]) -> list[str]:
    """Replace each ``--config FILE`` that uses ``__base__`` by the merged YAML, for LightningCLI."""
    out: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        value = None
        if arg in ("--config", "-c") and i + 1 < len(args):
            value, i = args[i + 1], i + 2
        elif arg.startswith("--config="):
            value, i = arg.split("=", 1)[1], i + 1
        else:
            out.append(arg)
            i += 1
            continue
        if _uses_base(value):
            value = yaml.safe_dump(load_experiment(value), sort_keys=False)
        out.extend(["--config", value])
    return out
