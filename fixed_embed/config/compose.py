"""Experiment YAML files: ``__base__`` composition, deep merge, callbacks by name, and a config
naming a class by a module that is gone refused with its new path (docs/design.md,
"Configuration")."""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import yaml

from fixed_embed.config.strict_yaml import MAX_YAML_CHARS, read_yaml
from fixed_embed.errors import ConfigError, MissingFileError


class ConfigYAMLError(ConfigError, yaml.YAMLError):
    """A config file that is not valid (safe) YAML."""


BASE_KEY = "__base__"
DEFAULT_RUN = (
    "default"  # the run name without --run: its folder is <save_dir>/<logger name>/default/
)


def deep_merge(base: Any, override: Any) -> Any:
    """Recursive for mappings, but one whose ``class_path`` changes is replaced whole (its
    ``init_args`` won't fit)."""
    if not (isinstance(base, dict) and isinstance(override, dict)):
        return override
    if "class_path" in override and override.get("class_path") != base.get("class_path"):
        return override
    return base | {
        key: deep_merge(base[key], value) if key in base else value
        for key, value in override.items()
    }


def merge_flags(config: dict, flags: Iterable[str]) -> dict:
    """``config`` with each ``--a.b=VALUE`` (or ``--a.b VALUE``) of ``flags`` merged in, its
    VALUE read as YAML, as fit reads it."""
    given = iter(flags)
    for flag in given:
        key, eq, value = flag.partition("=")
        value = value if eq else next(given, "")
        with contextlib.suppress(yaml.YAMLError):  # text that is not YAML is a string, as for fit
            value = read_yaml(value, key)
        for part in reversed(key.removeprefix("--").split(".")):
            value = {part: value}
        config = deep_merge(config, value)
    return config


def load_experiment(
    path: str | Path | dict, named_before: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The experiment at ``path`` with its ``__base__`` chain merged in (base first), its
    callbacks a list; a loaded one (a dict) as it is. ``named_before``: earlier ``--config``
    files' named callbacks, which this file's change."""
    if isinstance(path, dict):
        return path
    experiment = _merged(path, ())
    if (callbacks := _named_callbacks(experiment)) is not None:
        if named_before is not None:
            named_before.update(deep_merge(dict(named_before), callbacks))
            callbacks = named_before
        experiment["trainer"]["callbacks"] = [
            callback for callback in callbacks.values() if callback is not None
        ]
    return experiment


def _named_callbacks(experiment: Any) -> dict[str, Any] | None:
    trainer = experiment.get("trainer") if isinstance(experiment, dict) else None
    callbacks = trainer.get("callbacks") if isinstance(trainer, dict) else None
    return callbacks if isinstance(callbacks, dict) else None


def _merged(path: str | Path, seen: tuple[Path, ...]) -> dict[str, Any]:
    path = Path(path).resolve()
    if not path.is_file():
        what = "is a folder, not a file" if path.is_dir() else "not found"
        raise MissingFileError(f"experiment config {what}: {path}")
    if path in seen:
        raise ConfigError(f"__base__ cycle: {' -> '.join(str(p) for p in (*seen, path))}")
    try:
        # what read_yaml takes, and one more: a larger file is refused, read no further
        with path.open() as file:
            text = file.read(MAX_YAML_CHARS + 1)
        if not text.strip():
            raise ConfigError(
                f"experiment config {path} is empty; pass an experiment YAML (experiments/...)"
            )
        data = read_yaml(text, str(path)) or {}
    except UnicodeDecodeError as error:
        raise ConfigError(
            f"{path} is not a text file ({error.reason}); pass an experiment YAML"
        ) from None
    except (
        yaml.YAMLError
    ) as error:  # still a YAMLError (a refused python tag is one): and a user error
        raise ConfigYAMLError(
            f"{path} is not a readable YAML file: {' '.join(str(error).split())}"
        ) from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a YAML mapping, got {type(data).__name__}")
    # a config saved before a class of this project moved: every such class_path, with its new one
    if moved := [
        f"{spec} has moved to {new}" for spec in _class_paths(data) if (new := _new_home(spec))
    ]:
        raise ConfigError(f"{path}: class_path {'; '.join(moved)}; change it in the file")
    bases = data.pop(BASE_KEY, [])
    merged: dict[str, Any] = {}
    for base in [bases] if isinstance(bases, str) else bases:
        merged = deep_merge(merged, _merged(path.parent / base, (*seen, path)))
    return deep_merge(merged, data)


# The packages whose public names are stable class paths (fixed_embed.public_names): where a moved
# class is now.
PUBLIC_PACKAGES = ("fixed_embed.interfaces", "fixed_embed.distributed", "callbacks")


def _class_paths(data: Any) -> Iterator[str]:
    if isinstance(data, dict) and isinstance(data.get("class_path"), str):
        yield data["class_path"]
    for value in (
        data.values() if isinstance(data, dict) else data if isinstance(data, list) else ()
    ):
        yield from _class_paths(value)


def _new_home(spec: str) -> str | None:
    """The package path of a class whose module is gone; nothing is imported while the module
    exists."""
    module, _, name = spec.rpartition(".")
    with contextlib.suppress(ModuleNotFoundError):  # a parent package is gone too
        if (
            not spec.startswith(("fixed_embed.", "callbacks."))
            or importlib.util.find_spec(module) is not None
        ):
            return None
    return next(
        (
            f"{home}.{name}"
            for home in PUBLIC_PACKAGES
            if hasattr(importlib.import_module(home), name)
        ),
        None,
    )


def is_composed(path: str) -> bool:
    """Whether :func:`load_experiment` changes the file: it has a ``__base__`` or names its
    callbacks."""
    try:
        data = read_yaml(Path(path).read_text(), path)
    except (OSError, yaml.YAMLError):
        return False
    return isinstance(data, dict) and (BASE_KEY in data or _named_callbacks(data) is not None)
