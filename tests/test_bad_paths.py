"""Every sub-command x every path-like argument x every bad input: exit 2, no traceback, the
path named.

Generated, not listed: the sub-commands come from ``fixed_embed.cli.COMMANDS``; each one's arguments
from its own parser (argparse's, captured when its ``run`` parses; LightningCLI's for ``fit``,
``validate`` and ``test``). An argument is path-like by its name (:data:`PATH_LIKE`); its *role*
(checkpoint, sharded folder, corpus, tokenizer, config, results file, output) by its name too, and a
valid value per role makes a baseline command that only the substituted argument spoils. A new
sub-command or argument is therefore covered without an edit here; a name that no role matches fails
:func:`test_every_path_argument_has_a_role` instead of going untested.

``lm-eval`` is lm-eval's own command line (its parser, its messages) and is left out; ``test`` runs
exactly validate's checks (:data:`SKIPPED`).
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import os
import re
from pathlib import Path

import pytest
import torch
import yaml

from fixed_embed.cli import COMMANDS
from tests.cli import run_cli

ROOT = Path(__file__).resolve().parents[1]
SKIPPED = {
    "lm-eval": "lm-eval's own CLI",
    "test": "the same parser and before-work checks as validate (fixed_embed/cli/train.py); ~0.7 s "
    "a case",
}
# LightningCLI builds its parser per launch (~0.7 s): validate's cases run in the full suite only.
SLOW = {"validate"}
PATH_LIKE = re.compile(
    r"(^|[._-])(config|ckpt_path|checkpoints?|folder|out|output|data|train|valid|tokenizer|results|include_path)$"
)
OUTPUT = re.compile(r"(^|[._-])(out|output|default_root_dir|save_dir)$")
BAD_INPUTS = ("missing", "empty", "folder", "random", "bad_record", "too_long")
BAD_OUTPUTS = ("too_long", "under_a_file")
LIGHTNING = {"fit", "validate", "test"}  # LightningCLI: the run's own paths are the config's keys


class _Parsed(Exception):
    def __init__(self, parser):
        self.parser = parser


@functools.cache
def argparse_parser(command: str) -> argparse.ArgumentParser:
    """The argparse parser a sub-command builds, caught at its ``parse_args`` (nothing runs)."""
    module = importlib.import_module(COMMANDS[command])
    original = argparse.ArgumentParser.parse_args, argparse.ArgumentParser.parse_known_args

    def capture(self, *args, **kwargs):
        raise _Parsed(self)

    argparse.ArgumentParser.parse_args = argparse.ArgumentParser.parse_known_args = capture
    try:
        module.run([command])
    except _Parsed as parsed:
        return parsed.parser
    finally:
        argparse.ArgumentParser.parse_args, argparse.ArgumentParser.parse_known_args = original


def arguments(command: str) -> list[tuple[str, bool, bool]]:
    """``(flag or positional name, positional, required)`` of every path-like argument of
    ``command``."""
    if command in LIGHTNING:
        return _lightning_arguments()
    found = []
    for action in argparse_parser(command)._actions:
        if (
            action.choices
            or action.nargs == 0
            or action.type in (int, float)
            or not PATH_LIKE.search(action.dest)
        ):
            continue
        flag = action.option_strings[-1] if action.option_strings else action.dest
        found.append(
            (flag, not action.option_strings, bool(action.required) or not action.option_strings)
        )
    return found


@functools.cache
def _lightning_arguments() -> list[tuple[str, bool, bool]]:
    """The path-like keys of LightningCLI's fit parser: ``--config``, ``--ckpt_path`` and
    ``data.*`` ones (``trainer.*`` paths are outputs -- the run folder -- and ``model.*`` holds
    none)."""
    from fixed_embed.cli.train import FixedEmbedCLI

    original = FixedEmbedCLI.parse_arguments

    def capture(self, parser, args):
        raise _Parsed(parser)

    FixedEmbedCLI.parse_arguments = capture
    try:
        FixedEmbedCLI(args=["fit"])
    except _Parsed as parsed:
        fit = parsed.parser._subcommands_action._name_parser_map["fit"]
    finally:
        FixedEmbedCLI.parse_arguments = original
    keys = {
        a.dest
        for a in fit._actions
        if PATH_LIKE.search(a.dest)
        and not OUTPUT.search(a.dest)
        and "Print" not in type(a).__name__
    }
    return [
        (f"--{key}", False, False)
        for key in sorted(keys)
        if "." not in key or key.startswith("data.")
    ]


def role(flag: str, command: str = "") -> str:
    name = flag.lstrip("-").replace("-", "_").split(".")[-1]
    if command in LIGHTNING and flag == "--data":
        return "config"  # LightningCLI's --data takes the data section as a YAML file
    if OUTPUT.search(name):
        return "output"
    return {
        "ckpt_path": "checkpoint",
        "checkpoints": "checkpoint",
        "folder": "sharded",
        "train": "corpus",
        "valid": "corpus",
        "data": "corpus",
        "include_path": "tasks",
    }.get(name, name)


ROLES = {"checkpoint", "sharded", "corpus", "tokenizer", "config", "results", "tasks", "output"}


def commands() -> list[str]:
    return [c for c in COMMANDS if c not in SKIPPED]


# -- the valid inputs of each role
# -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def valid(tmp_path_factory, corpus):
    from fixed_embed.data.tokenizer import load_tokenizer
    from fixed_embed.train.module import LanguageModel
    from tests.helpers import TINY_DECODER
    from tests.test_safety import dcp_folder

    data, tok = corpus
    folder = tmp_path_factory.mktemp("valid")
    model = LanguageModel(decoder=TINY_DECODER)
    datamodule_state = {"tokenizer": str(tok), "tokenizer_json": load_tokenizer(tok).to_str()}
    checkpoint = {
        "state_dict": model.state_dict(),
        "hyper_parameters": dict(model.hparams),
        "global_step": 0,
        "TextDataModule": datamodule_state,
    }
    torch.save(checkpoint, folder / "tiny.ckpt")
    meta = {k: v for k, v in checkpoint.items() if k != "state_dict"}
    sharded = dcp_folder(folder / "sharded.ckpt", {"state_dict": model.state_dict()}, meta)
    results = folder / "results.json"
    results.write_text(json.dumps({"model": "m", "columns": [], "scores": {}}))
    tasks = folder / "tasks"
    tasks.mkdir()
    return {
        "checkpoint": folder / "tiny.ckpt",
        "sharded": sharded,
        "corpus": data,
        "tokenizer": tok,
        "config": ROOT / "experiments" / "tiny" / "gf2.yaml",
        "results": results,
        "tasks": tasks,
    }


def bad(kind: str, role_: str, where: Path) -> Path:
    """A bad input of ``kind`` for an argument of ``role_``, made under ``where``."""
    suffix = {
        "checkpoint": ".ckpt",
        "sharded": ".ckpt",
        "corpus": ".jsonl",
        "tokenizer": ".json",
        "config": ".yaml",
        "results": ".json",
        "tasks": "",
        "output": "",
    }[role_]
    path = where / f"bad-{kind}{suffix}"
    if kind == "missing":
        return where / "no" / f"such{suffix}"
    if kind == "empty":
        path.write_bytes(b"")
    elif kind == "folder":
        path.mkdir()
    elif kind == "random":
        path.write_bytes(os.urandom(2048))
    elif kind == "too_long":
        return where / ("n" * 300 + suffix)
    elif kind == "under_a_file":
        (where / "a-file").write_text("x")
        return where / "a-file" / "out"
    elif kind == "bad_record":
        if role_ == "corpus":
            path.write_text(
                '{"text": "one good document"}\n{"text": "a broken record\n{"text": "another"}\n'
            )
        elif role_ in ("checkpoint", "sharded"):
            torch.save(
                {"state_dict": {"w": torch.zeros(2)}, "hyper_parameters": {"decoder": "wide"}}, path
            )
        elif role_ == "tokenizer":
            path.write_text(
                json.dumps(
                    {"version": "1.0", "model": {"type": "BPE", "vocab": "not a vocabulary"}}
                )
            )
        elif role_ == "config":
            path.write_text(yaml.safe_dump({"model": {"decoder": {"d_model": "wide"}}}))
        elif role_ == "results":
            path.write_text(json.dumps({"model": "m", "columns": "not a list", "scores": {}}))
        elif role_ == "tasks":
            path.mkdir()
            (path / "broken.yaml").write_text("task: [unclosed\n")
    return path


def baseline(command: str, valid: dict, where: Path) -> tuple[list[str], dict[str, list[str]]]:
    """The command's valid line: fixed leading words and, per path argument, its valid tokens."""
    if command in LIGHTNING:
        from tests.test_lifecycle import fit_args

        line = fit_args(
            where, (valid["corpus"], valid["tokenizer"]), "gf2", "--trainer.max_steps", "1"
        )[1:]
        # the flags under test are added last (later flags win); --config and --data.* are already
        # valid
        return [command, *line, "--ckpt_path", str(valid["checkpoint"])] if command != "fit" else [
            command,
            *line,
        ], {}
    lead = [command] + (["probe"] if command == "analyze" else [])
    parts: dict[str, list[str]] = {}
    for flag, positional, required in arguments(command):
        if not required:
            continue
        value = (
            str(where / f"out-{flag.strip('-')}")
            if role(flag, command) == "output"
            else str(valid[role(flag, command)])
        )
        parts[flag] = [value] if positional else [flag, value]
    # Options that keep the baseline offline and small (a command's defaults may reach the hub).
    lead += {
        "eval": ["--suite", "offline", "--limit", "2"],
        "prefetch": ["--suite", "offline"],
        "generate": ["--prompt", "Once", "--max-new-tokens", "2"],
    }.get(command, [])
    return lead, parts


def cases():
    for command in commands():
        for flag, positional, _ in arguments(command):
            for kind in BAD_OUTPUTS if role(flag, command) == "output" else BAD_INPUTS:
                marks = [pytest.mark.slow] if command in SLOW else []
                yield pytest.param(
                    command, flag, positional, kind, id=f"{command}:{flag}:{kind}", marks=marks
                )


def test_every_path_argument_has_a_role():
    for command in commands():
        for flag, _, _ in arguments(command):
            assert role(flag, command) in ROLES, (
                f"{command} {flag}: give its role a valid input in tests/test_bad_paths.py"
            )


def test_the_generated_cases_cover_every_sub_command():
    covered = {case.values[0] for case in cases()}
    # every sub-command has a path to spoil
    assert covered == set(commands()), set(commands()) - covered
    print(f"{sum(1 for _ in cases())} (sub-command x argument x bad input) combinations")


@pytest.mark.parametrize(("command", "flag", "positional", "kind"), list(cases()))
def test_a_bad_path_is_refused_naming_it(command, flag, positional, kind, valid, tmp_path):
    lead, parts = baseline(command, valid, tmp_path)
    path = bad(kind, role(flag, command), tmp_path)
    parts[flag] = [str(path)] if positional else [flag, str(path)]
    positionals = [t for f, p, _ in arguments(command) if p and f in parts for t in parts[f]]
    options = [t for f, p, _ in arguments(command) if not p and f in parts for t in parts[f]]
    result = run_cli(*lead, *positionals, *options)
    assert result.returncode == 2, (result.returncode, result.stderr[-2500:])
    assert "Traceback" not in result.stderr, result.stderr[-2500:]
    shown = str(path) if kind != "too_long" else path.name[:40]
    assert shown in result.stderr or str(path.parent) in result.stderr, result.stderr[-2500:]
    assert "Checkpoints:" not in result.stderr  # refused before any training
