"""YAML read strictly: what no config holds (a key twice, a key that is not a string, an alias
bomb, nesting or size past any config's) is refused in one line naming its source, before
anything expands it; :func:`use_in_jsonargparse` makes every YAML jsonargparse reads go through
it too."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jsonargparse
import yaml

from fixed_embed.errors import UserError

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
    # past the limit, or inside its own alias: refused below
    if id(node) not in known and level <= MAX_YAML_LEVELS:
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


_JSONARGPARSE_YAML = jsonargparse.get_loader("yaml")  # its own: 1e-3 a float, a date text


def use_in_jsonargparse() -> None:
    """Every YAML jsonargparse reads (a --config file, --model FILE, a command-line value) read
    strictly too: call before it parses (idempotent)."""
    jsonargparse.set_loader(
        "yaml",
        lambda text, path=None: read_yaml(text, path or "a YAML value", _JSONARGPARSE_YAML),
        (yaml.YAMLError,),
    )
