"""Configs read strictly: YAML that is legal but that no config holds (a key twice at any depth,
a key that is not a string, an alias bomb, nesting past any config's, a file far larger than
one) is refused by every way a YAML reaches the project, in one line naming the file or the
flag, without a traceback and before anything expands it.

The cases are generated: each key of each mapping of experiments/tiny/gf2.yaml and its
``__base__`` chain given twice in turn, and each pathological value placed in that config; each
goes through every route (ROUTES)."""

from __future__ import annotations

import copy
import math
import tracemalloc
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonargparse
import pytest
import yaml

from fixed_embed.config import BASE_KEY, read_yaml
from fixed_embed.config.strict_yaml import MAX_YAML_CHARS, MAX_YAML_LEVELS, MAX_YAML_VALUES
from fixed_embed.errors import UserError
from tests.cli import run_cli

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENT = ROOT / "experiments" / "tiny" / "gf2.yaml"
# the parts of a config that fit also takes as a file or a value
SECTIONS = (
    "model",
    "data",
    "trainer",
)
# where a case's pathological value goes, written as YAML text (anchors need text)
HOLE = "value_of_the_case"


class Twice(list):
    """A mapping's (key, value) pairs, one key given twice: written as a YAML mapping that holds
    it twice."""


class Writer(yaml.SafeDumper):
    pass


Writer.add_representer(
    Twice, lambda writer, pairs: writer.represent_mapping("tag:yaml.org,2002:map", list(pairs))
)


def chain(path: Path) -> list[Path]:
    """``path`` and its ``__base__`` files, each once."""
    bases = yaml.safe_load(path.read_text()).get(BASE_KEY, [])
    return [
        path,
        *(
            p
            for base in ([bases] if isinstance(bases, str) else bases)
            for p in chain(path.parent / base)
        ),
    ]


def experiment(path: Path) -> dict:
    """The file's own mapping, its ``__base__`` an absolute path (the cases are written
    elsewhere)."""
    data = yaml.safe_load(path.read_text())
    if BASE_KEY in data:
        data[BASE_KEY] = str((path.parent / data[BASE_KEY]).resolve())
    return data


def mappings(data: Any, path: tuple = ()) -> Iterator[tuple]:
    """The path of every mapping in ``data``, lists' items included."""
    if isinstance(data, dict):
        yield path
    for key, value in (
        data.items()
        if isinstance(data, dict)
        else enumerate(data)
        if isinstance(data, list)
        else ()
    ):
        yield from mappings(value, (*path, key))


def at(data: Any, path: tuple) -> Any:
    for key in path:
        data = data[key]
    return data


def put(data: Any, path: tuple, value: Any) -> Any:
    """A copy of ``data`` with ``value`` at ``path`` (made where missing)."""
    data = copy.deepcopy(data)
    if not path:
        return value
    parent = data
    for key in path[:-1]:
        parent = parent.setdefault(key, {}) if isinstance(parent, dict) else parent[key]
    parent[path[-1]] = value
    return data


@dataclass
class Case:
    name: str
    data: dict  # the config: a Twice somewhere, or HOLE where ``value`` goes
    where: tuple  # the path of the mapping (or value) that is wrong
    value: str = ""  # YAML text for HOLE
    routes: tuple[str, ...] = ()  # those it can take (every one if empty)

    def text(self, data: Any, flow: bool = False) -> str:
        text = yaml.dump(
            data, Dumper=Writer, default_flow_style=flow, sort_keys=False, width=math.inf
        )
        return text.replace(HOLE, self.value)


def twice_cases() -> Iterator[Case]:
    """Each key of each mapping (at every depth) of the experiment's files, given twice in turn."""
    for file in chain(EXPERIMENT):
        data = experiment(file)
        for where in mappings(data):
            for key, value in at(data, where).items():
                pairs = Twice([*at(data, where).items(), (key, value)])
                dotted = ".".join(map(str, (*where, key)))
                yield Case(
                    f"{file.relative_to(ROOT)}:{dotted}-twice", put(data, where, pairs), where
                )


def bomb(levels: int, width: int) -> str:
    """Billion laughs: each anchor a list of ``width`` aliases of the one before, ``width **
    levels`` values."""
    anchors = [
        "&l0 [0]",
        *(f"&l{i} [{', '.join([f'*l{i - 1}'] * width)}]" for i in range(1, levels + 1)),
    ]
    return f"[{', '.join(anchors)}]"


def deep_chain(anchors: int, levels: int) -> str:
    """Anchors each nested ``levels`` deep (within the limit) around an alias of the one before:
    deeper in all."""
    nested = [
        f"&d{i} {'[' * levels}{f'*d{i - 1}' if i else 0}{']' * levels}" for i in range(anchors)
    ]
    return f"[{', '.join(nested)}]"


# Pathological values, each placed at model.optimizer of the experiment (a mapping fit takes as a
# file or a value).
VALUES = {
    "billion-laughs-aliases": bomb(9, 10),  # 10**9 values, from 100 aliases
    "wide-aliases": f"[&a [{', '.join(['0'] * 1000)}], "
    f"{', '.join(['*a'] * (MAX_YAML_VALUES // 1000 + 1))}]",
    "alias-inside-its-anchor": "&a [*a]",
    "alias-chain-too-deep": deep_chain(4, MAX_YAML_LEVELS * 2 // 3),
    "nested-too-deep": "[" * (MAX_YAML_LEVELS + 10) + "]" * (MAX_YAML_LEVELS + 10),
    "nested-past-the-parser": "[" * 5000 + "]" * 5000,
    "int-key": "{1: x}",
    "bool-key": "{yes: 1}",
    "null-key": "{null: 1}",
    "float-key": "{0.5: 1}",
    "list-key": "{? [a, b] : 1}",
    "mapping-key": "{? {a: 1} : 1}",
    "merge-key": "{<<: {lr: 0.1}, lr: 0.2}",
    "tagged-key": "{!!python/name:os.system x: 1}",
    # beyond what one command-line argument can carry (Linux: 128 KiB), so files only
    "huge-file": "'" + "x" * MAX_YAML_CHARS + "'",
}
FILE_ROUTES = ("config", "base", "plain", "section", "params")


def value_cases() -> Iterator[Case]:
    data, where = experiment(EXPERIMENT), ("model", "optimizer")
    for name, value in VALUES.items():
        yield Case(
            name, put(data, where, HOLE), where, value, FILE_ROUTES if name == "huge-file" else ()
        )


CASES = [*twice_cases(), *value_cases()]


# -- the routes: how a YAML reaches the project
# --------------------------------------------------------------------


def plain(data: dict | Twice) -> dict | Twice:
    """The config without its ``__base__``."""
    pairs = [
        (key, value)
        for key, value in (data if isinstance(data, Twice) else data.items())
        if key != BASE_KEY
    ]
    return Twice(pairs) if isinstance(data, Twice) else dict(pairs)


def value_flag(case: Case) -> tuple[str, Any]:
    """The flag that takes the wrong mapping as a value: its dotted key up to the first list
    index."""
    keys = case.where[
        : next((i for i, key in enumerate(case.where) if isinstance(key, int)), len(case.where))
    ]
    if not keys or keys[0] not in SECTIONS:
        return "--config", plain(case.data)
    return "--" + ".".join(keys), at(case.data, keys)


def via_config(
    case: Case, folder: Path
) -> tuple[list, str]:  # the file as given, with its __base__ if it has one
    (file := folder / "case.yaml").write_text(case.text(case.data))
    return ["fit", "--config", file, "--print_config"], str(file)


def via_base(
    case: Case, folder: Path
) -> tuple[list, str]:  # the file as the __base__ of the one given
    (file := folder / "case.yaml").write_text(case.text(case.data))
    (child := folder / "child.yaml").write_text(f"{BASE_KEY}: case.yaml\n")
    return ["fit", "--config", child, "--print_config"], str(file)


def via_plain(
    case: Case, folder: Path
) -> tuple[list, str] | None:  # without __base__, after the experiment
    if BASE_KEY in case.name:
        return None
    (file := folder / "plain.yaml").write_text(case.text(plain(case.data)))
    return ["fit", "--config", EXPERIMENT, "--config", file, "--print_config"], str(file)


def via_section(
    case: Case, folder: Path
) -> tuple[list, str] | None:  # --model FILE (or --data, --trainer)
    if not case.where or case.where[0] not in SECTIONS:
        return None
    (file := folder / f"{case.where[0]}.yaml").write_text(case.text(case.data[case.where[0]]))
    return ["fit", "--config", EXPERIMENT, f"--{case.where[0]}", file, "--print_config"], str(file)


def via_value(
    case: Case, folder: Path
) -> tuple[list, str] | None:  # a command-line value: read as YAML
    flag, value = value_flag(case)
    if flag == "--config" and BASE_KEY in case.name:  # the config as a value holds no __base__
        return None
    return [
        "fit",
        "--config",
        EXPERIMENT,
        flag,
        case.text(value, flow=True).strip(),
        "--print_config",
    ], flag


def via_params(case: Case, folder: Path) -> tuple[list, str]:  # fixed-embed params CONFIG
    (file := folder / "case.yaml").write_text(case.text(case.data))
    return ["params", file], str(file)


def via_params_value(
    case: Case, folder: Path
) -> tuple[list, str] | None:  # params CONFIG --model.KEY VALUE
    flag, value = value_flag(case)
    if flag.count(".") < 1:  # params takes --model.KEY, not --model
        return None
    return ["params", EXPERIMENT, flag, case.text(value, flow=True).strip()], flag


ROUTES: dict[str, Callable[[Case, Path], tuple[list, str] | None]] = {
    "config": via_config,
    "base": via_base,
    "plain": via_plain,
    "section": via_section,
    "value": via_value,
    "params": via_params,
    "params-value": via_params_value,
}


def refusal(argv: list, names: str) -> str:
    """The one error line of ``fixed-embed ARGV``, which must exit 2 naming ``names``, without a
    traceback."""
    result = run_cli(*argv)
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert result.returncode == 2, (argv[:4], result.returncode, result.stderr[-1000:])
    assert "Traceback" not in result.stderr and len(errors) == 1, result.stderr[-2000:]
    assert names in errors[0] or names.lstrip("-") in errors[0], (names, errors[0][:500])
    assert len(errors[0]) < 600, errors[0]
    return errors[0]


@pytest.fixture(scope="module", autouse=True)
def warm():
    """Each command's imports done once, before any case is measured."""
    run_cli("fit", "--config", EXPERIMENT, "--model.optimizer", "{lr: 1, lr: 2}", "--print_config")
    run_cli("params", EXPERIMENT, "--model.optimizer", "{lr: 1, lr: 2}")


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_every_route_refuses_yaml_no_config_holds_in_one_line(case, tmp_path, monkeypatch):
    # the length of every text read_yaml parses: a file past the limit is refused unparsed
    parsed = []
    loader = yaml.CSafeLoader
    monkeypatch.setattr(yaml, "CSafeLoader", lambda text: parsed.append(len(text)) or loader(text))
    tried = 0
    for route, build in ROUTES.items():
        if (case.routes and route not in case.routes) or (given := build(case, tmp_path)) is None:
            continue
        if "alias" not in case.name:
            refusal(*given)
        # refused before anything expands it: the memory of the text as written, not of 10**9 values
        else:
            tracemalloc.start()
            try:
                refusal(*given)
                assert tracemalloc.get_traced_memory()[1] < 32 * 2**20, route
            finally:
                tracemalloc.stop()
        tried += 1
    assert tried >= 3 and parsed and max(parsed) <= MAX_YAML_CHARS
    # what LightningCLI parses itself (a file a config names, a default config file) is read
    # strictly too
    with pytest.raises(UserError, match=r"^a YAML value"):
        jsonargparse.get_loader("yaml")(case.text(case.data))


def test_the_cases_reach_every_route_and_key(tmp_path):
    """The generator is not empty-handed: every route, and the keys of each file of the
    experiment's chain."""
    routes: set[str] = set()
    for case in CASES:
        routes |= {
            route
            for route, build in ROUTES.items()
            if route not in routes and build(case, tmp_path)
        }
    assert routes == set(ROUTES)
    keys = {case.name.rsplit(":", 1)[-1].removesuffix("-twice") for case in CASES}
    assert {
        BASE_KEY,
        "model",
        "trainer.logger.init_args.name",
        "trainer.callbacks.benchmarks.init_args.tasks",
        "trainer.plugins.0.class_path",
        "data.seq_len",
    } <= keys


def test_the_refusals_name_the_key_and_both_lines(tmp_path):
    """The reported case: two ``model:`` blocks, the first lost without a word."""
    config = tmp_path / "twice.yaml"
    config.write_text(
        f"{BASE_KEY}: {EXPERIMENT}\nmodel:\n  optimizer:\n    lr: 0.1\nmodel:\n  optimizer:\n    "
        "lr: 0.2\n"
    )
    line = refusal(["fit", "--config", config, "--print_config"], str(config))
    assert "key 'model' is given twice (lines 2 and 5)" in line and "keep one" in line


def test_every_yaml_of_the_project_reads_strictly():
    """The experiments (and the SLURM settings) hold none of it: anchors, were they used, would
    stay readable."""
    files = sorted((ROOT / "experiments").rglob("*.yaml"))
    assert len(files) > 20
    for file in files:
        read_yaml(file.read_text(), str(file))
    shared = "a: &shared {lr: 0.1}\nb: *shared\nc: [*shared, *shared]\n"
    assert read_yaml(shared, "anchors") == {
        "a": {"lr": 0.1},
        "b": {"lr": 0.1},
        "c": [{"lr": 0.1}] * 2,
    }
    deepest = "a: " + "[" * (MAX_YAML_LEVELS - 1) + "]" * (MAX_YAML_LEVELS - 1)
    assert read_yaml(deepest, "deepest") is not None
