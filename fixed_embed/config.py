"""Experiment YAML files: ``__base__`` composition, deep merge, callbacks by name (docs/design.md, "Configuration")."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import math
import re
from collections.abc import Callable, Iterator
from math import inf
from pathlib import Path
from typing import Any

import yaml
from jsonargparse.typing import restricted_number_type

from fixed_embed.errors import ConfigError, MissingFileError, UserError


def _number(name: str, kind: type, *restrictions: tuple[str, float]) -> type:
    """A domain that jsonargparse checks while parsing (NaN fails every comparison), for config signatures."""
    domain = restricted_number_type(name, kind, list(restrictions))  # restrictions other than jsonargparse's own
    domain.__new__ = staticmethod(lambda cls, v: cls._validation_fn(cls, v) or kind(v))  # plain kind: weights_only-safe
    return domain


PositiveInt, NonNegativeInt = _number("an integer >= 1", int, (">=", 1)), _number("an integer >= 0", int, (">", -1))
PerMille = _number("an integer in [0, 1000]", int, (">=", 0), ("<=", 1000))
Beta = _number("in [0, 1)", float, (">=", 0.0), ("<", 1.0))
PositiveFinite = _number("a finite number > 0", float, (">", 0.0), ("<", inf))
NonNegativeFinite = _number("a finite number >= 0", float, (">=", 0.0), ("<", inf))
UnitInterval = _number("in [0, 1]", float, (">=", 0.0), ("<=", 1.0), ("<", inf))  # "< inf": not ClosedUnitInterval


class ConfigYAMLError(ConfigError, yaml.YAMLError):
    """A config file that is not valid (safe) YAML."""


BASE_KEY = "__base__"
DEFAULT_RUN = "default"  # the run name without --run: its folder is <save_dir>/<logger name>/default/


def deep_merge(base: Any, override: Any) -> Any:
    """Recursive for mappings, but one whose ``class_path`` changes is replaced whole (its ``init_args`` won't fit)."""
    if not (isinstance(base, dict) and isinstance(override, dict)):
        return override
    if "class_path" in override and override.get("class_path") != base.get("class_path"):
        return override
    merged = dict(base)
    for key, value in override.items():
        merged[key] = deep_merge(base[key], value) if key in base else value
    return merged


def load_experiment(path: str | Path | dict, named_before: dict[str, Any] | None = None) -> dict[str, Any]:
    """The experiment at ``path`` with its ``__base__`` chain merged in (base first), its callbacks a list; a loaded
    one (a dict) as it is. ``named_before``: earlier ``--config`` files' named callbacks, which this file's change."""
    if isinstance(path, dict):
        return path
    experiment = _merged(path, ())
    if (callbacks := _named_callbacks(experiment)) is not None:
        if named_before is not None:
            named_before.update(deep_merge(dict(named_before), callbacks))
            callbacks = named_before
        experiment["trainer"]["callbacks"] = [callback for callback in callbacks.values() if callback is not None]
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
        text = path.read_text()
        if not text.strip():
            raise ConfigError(f"experiment config {path} is empty; pass an experiment YAML (experiments/...)")
        data = yaml.safe_load(text) or {}
    except UnicodeDecodeError as error:
        raise ConfigError(f"{path} is not a text file ({error.reason}); pass an experiment YAML") from None
    except yaml.YAMLError as error:  # still a YAMLError (a refused python tag is one): and a user error
        raise ConfigYAMLError(f"{path} is not a readable YAML file: {error}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a YAML mapping, got {type(data).__name__}")
    _refuse_moved_classes(data, path)
    bases = data.pop(BASE_KEY, [])
    merged: dict[str, Any] = {}
    for base in [bases] if isinstance(bases, str) else bases:
        merged = deep_merge(merged, _merged(path.parent / base, (*seen, path)))
    return deep_merge(merged, data)


# The packages whose public names are stable class paths (fixed_embed.public_names): where a moved class is now.
PUBLIC_PACKAGES = ("fixed_embed.interfaces", "fixed_embed.distributed", "callbacks")


def _refuse_moved_classes(data: Any, path: Path) -> None:
    """Every ``class_path`` of this project whose module is gone (a config saved before a move), with its new path."""
    if moved := [f"{spec} has moved to {new}" for spec in _class_paths(data) if (new := _new_home(spec))]:
        raise ConfigError(f"{path}: class_path {'; '.join(moved)}; change it in the file")


def _class_paths(data: Any) -> Iterator[str]:
    if isinstance(data, dict) and isinstance(data.get("class_path"), str):
        yield data["class_path"]
    for value in data.values() if isinstance(data, dict) else data if isinstance(data, list) else ():
        yield from _class_paths(value)


def _new_home(spec: str) -> str | None:
    """The package path of a class whose module is gone; nothing is imported while the module exists."""
    module, _, name = spec.rpartition(".")
    try:
        if not spec.startswith(("fixed_embed.", "callbacks.")) or importlib.util.find_spec(module) is not None:
            return None
    except ModuleNotFoundError:  # a parent package is gone too
        pass
    return next((f"{home}.{name}" for home in PUBLIC_PACKAGES if hasattr(importlib.import_module(home), name)), None)


def _composed(path: str) -> bool:
    """Whether :func:`load_experiment` changes the file: it has a ``__base__`` or names its callbacks."""
    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError):
        return False
    return isinstance(data, dict) and (BASE_KEY in data or _named_callbacks(data) is not None)


def config_values(args: list[str], flags: tuple[str, ...] = ("--config", "-c")) -> list[str]:
    """The values given to ``flags`` in ``args`` (``--flag VALUE`` and ``--flag=VALUE``)."""
    values = [args[i + 1] for i, a in enumerate(args[:-1]) if a in flags]
    return values + [a.split("=", 1)[1] for a in args if a.split("=", 1)[0] in flags and "=" in a]


# Flags whose value may be a YAML file: the whole config, or one section of it (LightningCLI).
CONFIG_FILE_FLAGS = ("--config", "-c", "--data", "--model", "--trainer")


def expand_config_args(args: list[str]) -> list[str]:
    """Replace each ``--config FILE`` that :func:`load_experiment` changes by the merged YAML, for LightningCLI."""
    out: list[str] = []
    named: dict[str, Any] = {}  # the callbacks named so far, in order: a later --config changes them by name
    for value in config_values(args, CONFIG_FILE_FLAGS):
        if Path(value).is_file():
            with contextlib.suppress(yaml.YAMLError):  # jsonargparse reports those itself, naming the tag or line
                load_experiment(value)  # unreadable, empty, not text, not a mapping: one line naming the file
    i = 0
    while i < len(args):
        arg, i = args[i], i + 1
        if arg in ("--config", "-c") and i < len(args):
            value, i = args[i], i + 1
        elif arg.startswith("--config="):
            value = arg.split("=", 1)[1]
        else:
            out.append(arg)
            continue
        if _composed(value):
            value = yaml.safe_dump(load_experiment(value, named), sort_keys=False)
        out.extend(["--config", value])
    return out


def positive(flag: str, kind: type = int, zero: bool = False) -> Callable[[str], float]:
    """An argparse type: a finite ``kind`` > 0 (>= 0 if ``zero``), else a UserError naming ``flag`` in one line."""

    def parse(text: str) -> float:
        with contextlib.suppress(ValueError):  # refused below: a UserError passes argparse, which prints no usage
            if math.isfinite(value := kind(text)) and (value > 0 or (zero and value == 0)):
                return value
        raise UserError(f"{flag} must be a finite {kind.__name__} {'>=' if zero else '>'} 0, got {text!r}")

    return parse


def refused_value(message: str) -> str:
    """jsonargparse's refusal in one line: the keys, then the innermost reason (a dataclass's keys are nested)."""
    keys = re.findall(r'Parser key "([^"]+)":', message)
    reason = (re.split(r'Parser key "[^"]+":', message)[-1].strip().splitlines() or [""])[0].strip(" -")
    if "Union subtypes" in reason and (tried := re.search(r"Errors:\s*- (.+?)(?=\n\s*- |\n\s*Given value|$)", message,
                                                          re.S)):  # fmt: skip
        reason = " ".join(tried.group(1).split())  # what the first type refused: an unknown class_path, say
    reason = re.sub(r"Not of type (.+?): (?:.*: )?(.+?)( does not conform .*| not an integer)?$",
                    r"must be \1, got \2", reason)  # fmt: skip
    return (f"{'.'.join(keys)}: {reason}" if keys else " ".join(message.split()))[:400]
