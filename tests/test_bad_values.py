"""Every numeric and choice option x 0, -1, NaN, inf, a wrong type, an unknown choice: refused
in one line naming the option before any work, or a legal value that :data:`LEGAL` lists with
its reason.

Generated, not listed: fit's options from its own parser (LightningCLI: ``model.*``, ``data.*``,
``trainer.*``, found as tests/test_bad_paths.py finds them), the other sub-commands' from their
argparse parsers. An option is numeric or a choice by its type (its signature's, for fit). For
fit a case is a parse, then the checks fit runs before any work
(``fixed_embed.train.experiment.check_values``), in-process; for the others, their parser, then
the command itself where the parser takes the value.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import types
import typing
from pathlib import Path

import pytest

from fixed_embed.config import expand_config_args
from fixed_embed.errors import ConfigError
from tests.cli import run_cli
from tests.test_bad_paths import (  # noqa: F401 (valid: a fixture)
    _Parsed,
    argparse_parser,
    baseline,
    commands,
    valid,
)

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "experiments" / "tiny" / "gf2.yaml"
NUMBERS = ("0", "-1", ".nan", ".inf", "x")  # x: a wrong type
UNKNOWN = "no_such_choice"
# (option, value) -> why it is legal. Every other case must be refused.
# fmt: off
LEGAL = {
    **{(f"trainer.{k}", "-1"): "Lightning's -1: no limit / all"
       for k in ("max_steps", "max_epochs", "devices", "num_sanity_val_steps")},
    **{(f"trainer.{k}", "0"): "0 disables it (Lightning)" for k in (
        "fast_dev_run", "limit_train_batches", "limit_val_batches", "limit_test_batches",
        "limit_predict_batches",
        "overfit_batches", "min_steps", "min_epochs", "num_sanity_val_steps", "gradient_clip_val",
        "reload_dataloaders_every_n_epochs", "log_every_n_steps")},
    ("seed_everything", "0"): "a seed",
    # Not checked before work yet: Lightning parses a duration string when the Trainer is built
    # (its traceback).
    ("trainer.val_check_interval", "x"): "NOT CHECKED: a duration string ('DD:HH:MM:SS') is legal, "
                                         "Lightning parses it",
    ("model.loss_chunk_tokens", "0"): "0: the unchunked loss (documented)",
    ("model.schedule.warmup_steps", "0"): "no warm-up",
    ("model.schedule.min_lr_ratio", "0"): "cosine to 0",
    ("model.optimizer.weight_decay", "0"): "no decay",
    ("model.optimizer.betas", "0"): "beta 0: no momentum (AdamW takes [0, 1))",
    ("data.num_workers", "0"): "the main process reads",
    ("data.shuffle_buffer", "0"): "stream order",
    ("data.seed", "0"): "the default seed",
    ("data.holdout_per_mille", "0"): "no hold-out (with data.valid)",
    ("analyze --seed", "0"): "a label in the plot's title",
    ("pretokenize --holdout-per-mille", "0"): "no held-out shards",
    ("eval --num-fewshot", "0"): "zero-shot",
    ("generate --temperature", "0"): "greedy",
    ("generate --seed", "0"): "a seed",
    ("pretokenize --task", "0"): "the first task, with --tasks",
}
# fmt: on


@functools.cache
def fit_parser():
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
    fit.exit_on_error = False
    return fit


def _kind(hint) -> str | None:
    """``number``, ``numbers`` (a tuple of them), ``choice`` or None, from a type hint."""
    options = (
        typing.get_args(hint)
        if typing.get_origin(hint) in (typing.Union, types.UnionType)
        else (hint,)
    )
    if any(typing.get_origin(o) is typing.Literal for o in options):
        return "choice"
    if any(
        isinstance(o, type) and issubclass(o, (int, float)) and not issubclass(o, bool)
        for o in options
    ):
        return "number"
    if any(
        typing.get_origin(o) is tuple and _kind(typing.get_args(o)[0]) == "number" for o in options
    ):
        return "numbers"
    return None


def fit_options() -> list[tuple[str, str]]:
    found = []
    for action in fit_parser()._actions:
        if not action.dest.startswith(
            ("trainer.callbacks", "trainer.logger")
        ) and not action.dest.endswith(".help"):
            found += [
                (key, kind)
                for key, hint in _fields(
                    action.dest, getattr(action, "_typehint", None) or action.type
                )
                if (kind := "choice" if action.choices else _kind(hint))
            ]
    return found


def _fields(dest: str, hint) -> list[tuple[str, object]]:
    """``(key, type)`` of the option, or of each field of the dataclass it takes (``decoder:
    DecoderConfig | None``)."""
    options = (
        typing.get_args(hint)
        if typing.get_origin(hint) in (typing.Union, types.UnionType)
        else (hint,)
    )
    if (schema := next((o for o in options if dataclasses.is_dataclass(o)), None)) is None:
        return [(dest, hint)]
    return [
        f for name, h in typing.get_type_hints(schema).items() for f in _fields(f"{dest}.{name}", h)
    ]


def argparse_options(command: str) -> list[tuple[str, str, bool]]:
    """``(flag, kind, positional)`` of the command's numeric and choice arguments."""
    found = []
    for action in argparse_parser(command)._actions:
        numeric = action.type in (int, float) or getattr(
            action.type, "__qualname__", ""
        ).startswith("positive.")
        kind = "choice" if action.choices else ("number" if numeric else None)
        if kind:
            found.append(
                (
                    action.option_strings[-1] if action.option_strings else action.dest,
                    kind,
                    not action.option_strings,
                )
            )
    return found


def values(kind: str) -> tuple[str, ...]:
    return (UNKNOWN,) if kind == "choice" else NUMBERS


def fit_cases():
    for key, kind in fit_options():
        for value in values(kind):
            yield pytest.param(key, kind, value, id=f"fit:{key}:{value}")


@functools.cache
def _tiny_config() -> str:
    return expand_config_args(["--config", str(CONFIG)])[1]


def test_the_generators_find_the_options():
    keys = {key for key, _ in fit_options()}
    assert {
        "model.optimizer.lr",
        "model.decoder.n_heads",
        "data.seq_len",
        "trainer.accumulate_grad_batches",
        "trainer.max_steps",
        "model.on_nonfinite",
        "model.optimizer.betas",
    } <= keys, sorted(keys)
    flags = {
        f"{c} {flag}"
        for c in commands()
        if c not in ("fit", "validate", "test")
        for flag, *_ in argparse_options(c)
    }
    assert {
        "params --world-size",
        "eval --limit",
        "eval --batch-size",
        "pretokenize --workers",
    } <= flags, flags
    generated = {(key, value) for key, kind in fit_options() for value in values(kind)}
    generated |= {(f"{c.values[0]} {c.values[1]}", c.values[3]) for c in command_cases()}
    assert set(LEGAL) <= generated, set(LEGAL) - generated  # no stale reason
    print(
        f"{sum(1 for _ in fit_cases())} fit cases, {sum(1 for _ in command_cases())} sub-command "
        "cases"
    )


@pytest.mark.parametrize(("key", "kind", "value"), list(fit_cases()))
def test_a_bad_fit_value_is_refused_in_one_line_naming_the_key(key, kind, value):
    from fixed_embed.config import refused_value
    from fixed_embed.train.experiment import check_values

    given = f"[0.9, {value}]" if kind == "numbers" else value
    try:
        config = fit_parser().parse_args(["--config", _tiny_config(), f"--{key}", given])
    except argparse.ArgumentError as error:
        message = refused_value(str(error))
    else:
        try:
            check_values(config)
        except ConfigError as error:
            message = str(error)
        else:
            assert (key, value) in LEGAL, (
                f"--{key} {value} is taken: refuse it, or list it in LEGAL with a reason"
            )
            return
    assert (key, value) not in LEGAL, f"--{key} {value} is listed as legal but refused: {message}"
    assert "\n" not in message and key.split(".")[-1] in message, message


def model_cases():
    for key, kind, value in (case.values for case in fit_cases()):
        if key.startswith("model.") and (key, value) not in LEGAL:
            yield pytest.param(key, kind, value, id=f"params:{key}:{value}")


@pytest.mark.parametrize(("key", "kind", "value"), list(model_cases()))
def test_params_refuses_a_bad_model_value_of_its_config_in_one_line(key, kind, value):
    """``fixed-embed params CONFIG`` builds the config's model section as fit does
    (experiment.build_model)."""
    import yaml

    from fixed_embed.config import load_experiment
    from fixed_embed.train.experiment import build_model

    model = load_experiment(CONFIG)["model"]
    *path, last = key.split(".")[1:]
    section = functools.reduce(lambda node, name: node.setdefault(name, {}), path, model)
    section[last] = [0.9, yaml.safe_load(value)] if kind == "numbers" else yaml.safe_load(value)
    with pytest.raises(ConfigError) as refused:
        build_model(model)
    assert "\n" not in str(refused.value) and last in str(refused.value), str(refused.value)


# -- the other sub-commands' argparse numbers and choices
# ---------------------------------------------------------


def command_cases():
    for command in commands():
        if command in ("fit", "validate", "test"):
            continue
        for flag, kind, positional in argparse_options(command):
            for value in values(kind):
                yield pytest.param(command, flag, positional, value, id=f"{command}:{flag}:{value}")


@pytest.mark.parametrize(("command", "flag", "positional", "value"), list(command_cases()))
def test_a_bad_sub_command_value_is_refused_in_one_line(
    command,
    flag,
    positional,
    value,
    valid,  # noqa: F811
    tmp_path,
):
    lead, parts = baseline(command, valid, tmp_path)
    if positional:  # analyze's analysis: the first word after the command
        lead = [command, value]
    value_arg = [] if positional else [flag, value]
    line = [*lead, *[t for p in parts.values() for t in p], *value_arg]
    if (f"{command} {flag}", value) in LEGAL:  # the parser takes it (the command would run)
        assert argparse_parser(command).parse_args(line[1:]) is not None
        return
    result = run_cli(*line)
    assert result.returncode == 2 and "Traceback" not in result.stderr, (
        line,
        result.stderr[-2000:],
    )
    errors = [s for s in result.stderr.splitlines() if "error:" in s]
    assert len(errors) == 1 and flag in errors[0], result.stderr[-2000:]
    assert "usage:" not in result.stderr, result.stderr[-2000:]  # one line, not argparse's usage


def test_positive_refuses_what_is_not_a_finite_positive_number():
    from fixed_embed.config import positive
    from fixed_embed.errors import UserError

    assert (
        positive("-n")("3") == 3
        and positive("-f", float)("0.5") == 0.5
        and positive("-z", zero=True)("0") == 0
    )
    for text in ("0", "-1", "nan", "inf", "x", "1.5"):
        with pytest.raises(UserError, match=f"^-n must be a finite int > 0, got '{text}'$"):
            # not a ValueError: argparse would catch it and print its usage block
            positive("-n")(text)


def test_a_parsed_value_is_a_plain_number():
    """Not the domain's own subclass, which would reach the hyper-parameters: weights_only loads
    refuse it."""
    config = fit_parser().parse_args(["--config", _tiny_config(), "--model.optimizer.lr", "0.5"])
    assert type(config.model.optimizer.lr) is float and type(config.data.seq_len) is int
    assert {type(b) for b in config.model.optimizer.betas} == {float}


EXPERIMENTS = ROOT / "experiments"
OVERRIDE = EXPERIMENTS / "rehearsal" / "override.yaml"
COMPOSITIONS = [
    # slurm/: job settings, tests/test_slurm.py
    *(
        [p]
        for p in sorted(EXPERIMENTS.rglob("*.yaml"))
        if p.name not in ("callbacks.yaml", "plan.yaml")
        and p.parent.name not in ("strategies", "rehearsal", "gpu", "slurm")
    ),
    *(
        [EXPERIMENTS / "paper" / f"{v}.yaml", EXPERIMENTS / "strategies" / f"{s}.yaml", *extra]
        for v in ("learned", "gf2")
        for s in ("ddp", "fsdp")
        for extra in ([], [OVERRIDE])
    ),
    [
        EXPERIMENTS / "study" / "gf2.yaml",
        EXPERIMENTS / "study" / "gpu" / "base.yaml",
        EXPERIMENTS / "study" / "gpu" / "size-s.yaml",
    ],
]


@pytest.mark.parametrize("files", COMPOSITIONS, ids=lambda files: "+".join(p.stem for p in files))
def test_every_experiment_passes_the_value_checks(files, tmp_path):
    """The checks run on values as YAML gives them (an int -1, not the command line's string): every
    experiment as the Makefile and README compose them passes, and so does a YAML `devices: -1`
    (all GPUs)."""
    from fixed_embed.train.experiment import check_values

    devices = tmp_path / "devices.yaml"
    devices.write_text("trainer:\n  devices: -1\n  log_every_n_steps: 0\n")
    for extra in ([], [devices]):
        args = [arg for path in (*files, *extra) for arg in ("--config", str(path))]
        check_values(fit_parser().parse_args(expand_config_args(args)))
