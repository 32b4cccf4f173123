"""The command line's configs: each YAML file and value of ``fit``'s arguments read strictly,
composed files merged for LightningCLI, and jsonargparse's refusal said in one line."""

from __future__ import annotations

import contextlib
import os
import re

import yaml

from fixed_embed.config.compose import is_composed, load_experiment
from fixed_embed.config.strict_yaml import read_yaml


def config_values(args: list[str], flags: tuple[str, ...]) -> list[str]:
    """The values given to ``flags`` in ``args`` (``--flag VALUE`` and ``--flag=VALUE``)."""
    values = [args[i + 1] for i, a in enumerate(args[:-1]) if a in flags]
    return values + [a.split("=", 1)[1] for a in args if a.split("=", 1)[0] in flags and "=" in a]


# Flags whose value may be a YAML file: the whole config, or one section of it (LightningCLI).
CONFIG_FILE_FLAGS = ("--config", "-c", "--data", "--model", "--trainer")


def expand_config_args(args: list[str]) -> list[str]:
    """Each YAML file and value of ``args`` read strictly (a refusal names it, in one line);
    each ``--config FILE`` that :func:`load_experiment` changes replaced by the merged YAML, for
    LightningCLI."""
    out, named = list(args), {}  # named: the callbacks so far: a later --config changes them
    for i, arg in enumerate(args):
        flag, eq, value = arg.partition("=")
        at, value = (i, value) if eq else (i + 1, args[i + 1] if i + 1 < len(args) else "")
        # A YAMLError jsonargparse reports itself, naming the tag or line; a file that cannot be
        # read (empty, not text, not a mapping) is refused here in one line naming it. A YAML
        # text, however long, is not a file.
        with contextlib.suppress(yaml.YAMLError):
            if flag in CONFIG_FILE_FLAGS and os.path.isfile(value):
                load_experiment(value)
            elif flag.startswith("-"):
                read_yaml(value, flag)  # text that is not YAML is a string
        if flag in ("--config", "-c") and is_composed(value):
            merged = load_experiment(value, named)
            out[at] = (f"{flag}=" if eq else "") + yaml.safe_dump(merged, sort_keys=False)
    return out


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
        # what the first type refused: an unknown class_path, say
        reason = " ".join(tried.group(1).split())
    reason = re.sub(
        r"Not of type (.+?): (?:.*: )?(.+?)( does not conform .*| not an integer)?$",
        r"must be \1, got \2",
        reason,
    )
    return (f"{'.'.join(keys)}: {reason}" if keys else " ".join(message.split()))[:400]
