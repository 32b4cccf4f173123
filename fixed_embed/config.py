"""Experiment YAML files: ``__base__`` composition, deep merge, callbacks by name
(docs/design.md, "Configuration")."""

from __future__ import annotations

import contextlib
import importlib.util
import math
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jsonargparse
import yaml
from jsonargparse.typing import restricted_number_type

from fixed_embed.errors import ConfigError, MissingFileError, UserError


def domain(name: str, kind: type, *restrictions: tuple[str, float]) -> type:
    """A domain that jsonargparse checks while parsing (NaN fails every comparison), for config
    signatures."""
    typed = restricted_number_type(
        name, kind, list(restrictions)
    )  # restrictions other than jsonargparse's own
    typed.__new__ = staticmethod(
        lambda cls, v: cls._validation_fn(cls, v) or kind(v)
    )  # plain kind: weights_only-safe
    return typed


PositiveInt = domain("an integer >= 1", int, (">=", 1))
NonNegativeInt = domain("an integer >= 0", int, (">", -1))
PerMille = domain("an integer in [0, 1000]", int, (">=", 0), ("<=", 1000))
Beta = domain("in [0, 1)", float, (">=", 0.0), ("<", 1.0))
PositiveFinite = domain("a finite number > 0", float, (">", 0.0), ("<", math.inf))
NonNegativeFinite = domain("a finite number >= 0", float, (">=", 0.0), ("<", math.inf))
UnitInterval = domain(
    "in [0, 1]", float, (">=", 0.0), ("<=", 1.0), ("<", math.inf)
)  # "< inf": not ClosedUnitInterval


class ConfigYAMLError(ConfigError, yaml.YAMLError):
    """A config file that is not valid (safe) YAML."""


# Far beyond any config (experiments/: < 4 kB, < 10 levels, < 300 values): past them, a mistake or
# an attack.
MAX_YAML_CHARS, MAX_YAML_LEVELS, MAX_YAML_VALUES = 1_000_000, 32, 100_000


def read_yaml(text: str, source: str, load: Callable[[str], Any] | None = None) -> Any:
    """The safe YAML ``text`` (or ``load(text)``) once its nodes pass :func:`_strict`; a refusal
    names ``source`` (a file or a flag) and is a UserError, not a YAMLError or ValueError:
    jsonargparse takes those for text."""
    if len(text) > MAX_YAML_CHARS:
        raise UserError(
            f"{source} holds over {MAX_YAML_CHARS:,} characters, no config does: pass a config YAML"
        )
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)(text)
    try:
        node = loader.get_single_node()
    except yaml.YAMLError as error:
        if "nesting depth" not in str(error):  # libyaml's own limit (1000 levels), past ours too
            raise
        raise UserError(
            f"{source}: {' '.join(str(error).split())}; far deeper than a config: flatten it"
        ) from None
    if node is not None:
        _strict(node, source, 1, {})
    return load(text) if load else node and loader.construct_document(node)


def _strict(
    node: yaml.Node, source: str, level: int, known: dict[int, tuple[int, int]]
) -> tuple[int, int]:
    """The values and levels under ``node``, aliases expanded but each node counted once (a
    shared one from ``known``), so an alias bomb is refused before anything expands it; each key
    once, a string, no ``<<``."""
    if (
        id(node) not in known and level <= MAX_YAML_LEVELS
    ):  # past the limit, or inside its own alias: refused below
        lines: dict[str, int] = {}
        for key, _ in node.value if isinstance(node, yaml.MappingNode) else ():
            line, kind = key.start_mark.line + 1, key.tag.removeprefix("tag:yaml.org,2002:")
            if kind == "str" and key.value in lines:
                raise UserError(
                    f"{source}: key {key.value!r} is given twice (lines {lines[key.value]} and "
                    f"{line}), "
                    "so the first would be lost: keep one"
                )
            if kind != "str":
                what = repr(key.value) if isinstance(key, yaml.ScalarNode) else f"({key.id})"
                fix = (
                    "compose configs with __base__"
                    if kind == "merge"
                    else "quote it, or use a string key"
                )
                raise UserError(
                    f"{source}, line {line}: the key {what} is YAML's {kind}, not a string: {fix}"
                )
            lines[key.value] = line
        nodes = (
            [n for pair in node.value for n in pair]
            if isinstance(node, yaml.MappingNode)
            else node.value
        )
        inner = (
            [_strict(n, source, level + 1, known) for n in nodes]
            if isinstance(node, yaml.CollectionNode)
            else []
        )
        known[id(node)] = (
            1 + sum(size for size, _ in inner),
            1 + max((depth for _, depth in inner), default=0),
        )
    values, levels = known.get(id(node), (0, MAX_YAML_LEVELS))
    if (deep := level + levels - 1 > MAX_YAML_LEVELS) or values > MAX_YAML_VALUES:
        what = (
            f"nested deeper than {MAX_YAML_LEVELS} levels"
            if deep
            else f"over {MAX_YAML_VALUES:,} values"
        )
        raise UserError(
            f"{source}, line {node.start_mark.line + 1}: {what} with aliases expanded, far more "
            "than a "
            "config: write it out flat, with no alias inside its own anchor or of an alias"
        )
    return values, levels


# Every YAML jsonargparse reads (a --config file, --model FILE, a command-line value) is read
# strictly too.
_JSONARGPARSE_YAML = jsonargparse.get_loader("yaml")  # its own: 1e-3 a float, a date text
jsonargparse.set_loader(
    "yaml",
    lambda text, path=None: read_yaml(text, path or "a YAML value", _JSONARGPARSE_YAML),
    (yaml.YAMLError,),
)


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
        with (
            path.open() as file
        ):  # what read_yaml takes, and one more: a larger file is refused, read no further
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


def _composed(path: str) -> bool:
    """Whether :func:`load_experiment` changes the file: it has a ``__base__`` or names its
    callbacks."""
    try:
        data = read_yaml(Path(path).read_text(), path)  # a file expand_config_args has read already
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
    """Each YAML file and value of ``args`` read strictly (a refusal names it, in one line);
    each ``--config FILE`` that :func:`load_experiment` changes replaced by the merged YAML, for
    LightningCLI."""
    out, named = (
        list(args),
        {},
    )  # named: the callbacks so far, in order: a later --config changes them by name
    for i, arg in enumerate(args):
        flag, eq, value = arg.partition("=")
        at, value = (i, value) if eq else (i + 1, args[i + 1] if i + 1 < len(args) else "")
        with contextlib.suppress(
            yaml.YAMLError
        ):  # jsonargparse reports those itself, naming the tag or line
            if flag in CONFIG_FILE_FLAGS and os.path.isfile(
                value
            ):  # False for a YAML text, even a long one
                load_experiment(
                    value
                )  # unreadable, empty, not text, not a mapping: one line naming the file
            elif flag.startswith("-"):
                read_yaml(value, flag)  # text that is not YAML is a string
        if flag in ("--config", "-c") and _composed(value):
            out[at] = (f"{flag}=" if eq else "") + yaml.safe_dump(
                load_experiment(value, named), sort_keys=False
            )
    return out


def positive(flag: str, kind: type = int, zero: bool = False) -> Callable[[str], float]:
    """An argparse type: a finite ``kind`` > 0 (>= 0 if ``zero``), else a UserError naming
    ``flag`` in one line."""

    def parse(text: str) -> float:
        with contextlib.suppress(
            ValueError
        ):  # refused below: a UserError passes argparse, which prints no usage
            if math.isfinite(value := kind(text)) and (value > 0 or (zero and value == 0)):
                return value
        raise UserError(
            f"{flag} must be a finite {kind.__name__} {'>=' if zero else '>'} 0, got {text!r}"
        )

    return parse


def refused_value(message: str) -> str:
    """jsonargparse's refusal in one line: the keys, then the innermost reason (a dataclass's
    keys are nested)."""
    keys = re.findall(r'Parser key "([^"]+)":', message)
    reason = (re.split(r'Parser key "[^"]+":', message)[-1].strip().splitlines() or [""])[0].strip(
        " -"
    )
    if "Union subtypes" in reason and (
        tried := re.search(r"Errors:\s*- (.+?)(?=\n\s*- |\n\s*Given value|$)", message, re.S)
    ):
        reason = " ".join(
            tried.group(1).split()
        )  # what the first type refused: an unknown class_path, say
    reason = re.sub(
        r"Not of type (.+?): (?:.*: )?(.+?)( does not conform .*| not an integer)?$",
        r"must be \1, got \2",
        reason,
    )
    return (f"{'.'.join(keys)}: {reason}" if keys else " ".join(message.split()))[:400]
