"""Values each legal alone but not together, numbers at the edge of what they can count, and the
advice of every refusal: taken at its word, it must lift that refusal.

Generated, not listed: the interfaces are every :class:`InputInterface` that
``fixed_embed.interfaces`` exports (what a config's ``class_path`` may name), swept with
d_model, n_heads and vocab_size around the code width each declares (``least_d_model``); the
numbers are every numeric key of fit's parser (``tests.test_bad_values.fit_options``) and of the
config's interface, at sizes past int32, float64's exact integers, int64 and float64's range. A
case runs ``fixed-embed params`` and fit's checks before any work, in-process: exit 0, or exit 2
with one ``error:`` line naming the key, never a traceback, and never a run folder. A refusal
that says ``set KEY VALUE`` is run again with that change (each alternative): that refusal is
gone, and KEY is one the case set or the message names.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import re
import typing
from pathlib import Path

import pytest

import fixed_embed.interfaces as interfaces
from fixed_embed.errors import RunComplete
from fixed_embed.interfaces import InputInterface
from fixed_embed.model.decoder import DecoderConfig
from tests.cli import run_cli
from tests.test_bad_values import _kind, fit_options

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "experiments" / "tiny" / "gf2.yaml"
# a cheaper build: the keys swept are others
SMALL = [
    "--model.decoder.n_layers",
    "1",
    "--model.decoder.ffn_dim",
    "64",
]
# Past int64 (2**63: also the whole fit command), a float for an int (the reported max_steps 1e20),
# and a float at float64's range (a product with it overflows). Smaller edges (2**31, 2**53 + 1)
# meet the same declared domains.
EDGES = {int: (str(2**63), "1e20"), float: ("1e308",)}
DECODER_KEYS = {f.name for f in dataclasses.fields(DecoderConfig)}


def exported_interfaces() -> list[type]:
    return sorted(
        {
            c
            for c in vars(interfaces).values()
            if isinstance(c, type) and issubclass(c, InputInterface) and c is not InputInterface
        },
        key=lambda c: c.__name__,
    )


def options(cls: type) -> dict[str, object]:
    """The interface's own options (after vocab_size, d_model) and their types."""
    hints = typing.get_type_hints(cls.__init__)
    return {name: hints.get(name) for name in list(inspect.signature(cls).parameters)[2:]}


# -- running a case
# ---------------------------------------------------------------------------------------------


def params(overrides: dict[str, str]):
    return run_cli(
        "params",
        CONFIG,
        *SMALL,
        *(t for key, value in overrides.items() for t in (f"--{key}", value)),
    )


def fit(overrides: dict[str, str], where: Path):
    """fit up to the end of its checks before any work (then :class:`RunComplete`: exit 0,
    nothing trained)."""
    from fixed_embed.cli import train

    checked = train._preflight

    def stop(config):
        checked(config)
        raise RunComplete("checks passed")

    flags = [t for key, value in overrides.items() for t in (f"--{key}", value)]
    save = f"--trainer.logger.init_args.save_dir={where}"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(train, "_preflight", stop)
        result = run_cli("fit", "--config", CONFIG, *SMALL, save, "--run", "case", *flags)
    assert not (where / "tiny" / "gf2" / "case").exists(), "a run folder was made"
    return result


def refusal(result, overrides: dict[str, str]) -> str | None:
    """The one-line refusal (None: accepted), after asserting the command's contract."""
    assert "Traceback" not in result.stderr, (overrides, result.stderr[-3000:])
    if result.returncode == 0:
        return None
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert result.returncode == 2 and len(errors) == 1, (
        overrides,
        result.returncode,
        result.stderr[-3000:],
    )
    message = errors[0].split("error: ", 1)[1]
    named = named_keys(message)
    assert any(key in named or key.rsplit(".", 1)[-1] in message for key in overrides), (
        overrides,
        message,
    )
    return message


def named_keys(message: str, interface: type | None = None) -> set[str]:
    """The config keys a message names: dotted ones as written, an option's bare name under its
    section."""
    found = set(re.findall(r"\b((?:model|data|trainer)\.[a-z_.]*[a-z_])\b", message))
    for word in set(re.findall(r"\b([a-z_]+)\b", message)):
        if word in DECODER_KEYS:
            found.add(f"model.decoder.{word}")
        elif interface is not None and word in options(interface):
            found.add(f"model.interface.init_args.{word}")
    return found


def advice(message: str, interface: type | None) -> list[tuple[str, str]]:
    """Each ``KEY VALUE`` the message proposes after ``set`` (alternatives joined by `` or ``)."""
    if (
        match := re.search(r"\bset ((?:--)?[a-z_.]+ \S+(?: or (?:--)?[a-z_.]+ \S+)*)", message)
    ) is None:
        return []
    proposed = []
    for alternative in match.group(1).split(" or "):
        key, value = alternative.split()
        key = key.lstrip("-").rstrip(",")
        full = key if "." in key else next(iter(named_keys(key, interface)), key)
        proposed.append((full, value.rstrip(",.;)")))
    return proposed


def check_advice(
    run, overrides: dict[str, str], message: str, interface: type | None = None
) -> int:
    """Apply each proposal of ``message`` to the case: the refusal goes; returns how many were
    tried."""
    proposals = advice(message, interface)
    for key, value in proposals:
        assert key in set(overrides) | named_keys(message, interface), (key, message)
        assert overrides.get(key) != value, f"the advice repeats the case's own value: {message}"
        again = refusal(run({**overrides, key: value}), {**overrides, key: value})
        assert again is None or _shape(again) != _shape(message), (key, value, message, again)
    return len(proposals)


def _shape(message: str) -> str:
    """A refusal with its numbers dropped: another value of the same refusal has the same shape."""
    return re.sub(r"\d+", "N", message)


# -- 1. interfaces x d_model x n_heads x vocab_size
# ---------------------------------------------------------------


def interface_cases():
    for cls in exported_interfaces():
        coded = "code_width" in options(cls)
        for vocab, width in [(2, None), (300, None)] + [(300, w) for w in (8, 25, 63) if coded]:
            least = cls.least_d_model(vocab, code_width=width)  # below it, and at it in 2 heads
            for d_model, heads in {(max(1, least - 1), 1), (least, 2)}:
                yield pytest.param(
                    cls,
                    vocab,
                    width,
                    d_model,
                    heads,
                    id=f"{cls.__name__}-V{vocab}-K{width}-d{d_model}-h{heads}",
                )


@pytest.mark.parametrize(("cls", "vocab", "width", "d_model", "heads"), list(interface_cases()))
def test_an_interface_and_the_decoder_are_accepted_together_or_refused_in_one_line(
    cls, vocab, width, d_model, heads
):
    from fixed_embed.config import load_experiment
    from fixed_embed.train.experiment import build_model

    overrides = {
        "model.interface.class_path": f"fixed_embed.interfaces.{cls.__name__}",
        "model.decoder.vocab_size": str(vocab),
        "model.decoder.d_model": str(d_model),
        "model.decoder.n_heads": str(heads),
    }
    if width is not None:
        overrides["model.interface.init_args.code_width"] = str(width)
    message = refusal(params(overrides), overrides)
    if message is None:  # accepted: it really builds, on the meta device
        model = load_experiment(CONFIG)["model"]
        model["decoder"] = {
            **model["decoder"],
            "vocab_size": vocab,
            "d_model": d_model,
            "n_heads": heads,
        }
        model["interface"] = {
            "class_path": f"fixed_embed.interfaces.{cls.__name__}",
            "init_args": {} if width is None else {"code_width": width},
        }
        assert build_model(model).decoder.interface.d_model == d_model
        assert d_model >= cls.least_d_model(vocab, code_width=width)
        return
    check_advice(params, overrides, message, cls)


def test_the_sweep_meets_each_constraint():
    """Below an interface's code width, and at a head count that does not divide d_model:
    refused, with advice."""
    cases = {(c.values[0].__name__, *c.values[1:]) for c in interface_cases()}
    assert ("GF2CodeInput", 300, None, 8, 1) in cases and (
        "PermutedCodeInput",
        300,
        25,
        25,
        2,
    ) in cases
    assert {c.__name__ for c in exported_interfaces()} >= {
        "BinaryCodeInput",
        "GF2CodeInput",
        "LearnedInput",
        "RandomCodeInput",
        "LowRankLearnedInput",
    }
    # below the 13 bits of V = 8192
    overrides = {
        "model.decoder.d_model": "12",
        "model.decoder.n_heads": "6",
    }
    message = refusal(params(overrides), overrides)
    # 13 bits, in 6 heads of even dim
    assert message.endswith("set model.decoder.d_model 24"), message
    assert check_advice(params, overrides, message) == 1


# -- 2. every number at the edge of what it can count
# ------------------------------------------------------------


@functools.cache
def numeric_keys() -> dict[str, type]:
    """Every numeric key of fit's config and of its interface's options, and whether it takes
    floats or ints."""
    from fixed_embed.config import load_experiment
    from tests.test_bad_values import _fields, fit_parser

    actions = fit_parser()._actions
    hints = {
        key: hint
        for a in actions
        for key, hint in _fields(a.dest, getattr(a, "_typehint", None) or a.type)
    }
    keys = {key: hints.get(key) for key, kind in fit_options() if kind == "number"}
    spec = load_experiment(CONFIG)["model"]["interface"]
    cls = getattr(interfaces, spec["class_path"].rpartition(".")[2])
    keys.update(
        {
            f"model.interface.init_args.{name}": hint
            for name, hint in options(cls).items()
            if _kind(hint)
        }
    )
    return {key: float if _takes_float(hint) else int for key, hint in keys.items()}


def _takes_float(hint) -> bool:
    return (isinstance(hint, type) and issubclass(hint, float)) or any(
        _takes_float(h) for h in typing.get_args(hint)
    )


def edge_cases():
    for key, kind in numeric_keys().items():
        for value in EDGES[kind]:
            yield pytest.param(key, value, id=f"{key}={value}")


# ~90 cases of a fit's parse and checks (~20 s): in `make test`, not the inner loop
@pytest.mark.slow
@pytest.mark.parametrize(("key", "value"), list(edge_cases()))
def test_an_edge_size_is_taken_or_refused_in_one_line_before_any_work(key, value, tmp_path):
    """params, and fit's parse and checks of the values (as tests/test_bad_values.py runs them,
    ~30 ms); where fit takes 2**63, the whole command up to the end of its checks before any
    work (~0.3 s: LightningCLI builds its parser per launch), which also reads the data and
    takes the run folder's lock."""
    overrides = {key: value}
    # params runs fit's check_values too: Lightning's trainer.* numbers are tried through fit's
    # parse alone
    if (
        not key.startswith("trainer.")
        and (message := refusal(params(overrides), overrides)) is not None
    ):
        check_advice(params, overrides, message)
    if (message := refusal(checked_fit(overrides), overrides)) is not None:
        check_advice(checked_fit, overrides, message)
    elif value == str(2**63):
        assert refusal(fit(overrides, tmp_path), overrides) is None


def checked_fit(overrides: dict[str, str]):
    """fit's parse and its checks of the values (``check_values``), as a command's result."""
    from argparse import ArgumentError

    from fixed_embed.config import refused_value
    from fixed_embed.errors import UserError
    from fixed_embed.train.experiment import check_values
    from tests.cli import Result
    from tests.test_bad_values import _tiny_config, fit_parser

    try:
        check_values(
            fit_parser().parse_args(
                [
                    "--config",
                    _tiny_config(),
                    *SMALL,
                    *(t for k, v in overrides.items() for t in (f"--{k}", v)),
                ]
            )
        )
    except ArgumentError as error:
        return Result(2, "", f"fixed-embed fit: error: {refused_value(str(error))}\n")
    except UserError as error:
        return Result(2, "", f"fixed-embed fit: error: {error}\n")
    return Result(0, "", "")


def test_the_generators_find_the_numbers():
    keys = set(numeric_keys())
    assert {
        "trainer.max_steps",
        "model.token_budget",
        "model.decoder.d_model",
        "data.batch_size",
        "model.interface.init_args.code_seed",
        "trainer.accumulate_grad_batches",
    } <= keys, keys


@pytest.mark.parametrize("budget", [10**15, 2**53 + 1, 2**63, 10**30])
def test_the_updates_of_a_token_budget_are_counted_in_integers(budget, tmp_path):
    """``model.token_budget`` / targets per update, rounded up, exactly (a float division is off
    past 2**53)."""
    overrides = {"model.token_budget": str(budget), "trainer.max_steps": "-1"}
    result = fit(overrides, tmp_path)
    per_update = 8 * 256  # the tiny config: 1 device x 8 sequences x 1 accumulation x 256 targets
    steps = -(-budget // per_update)
    if steps > (2**63 - 1) // 8:  # more sequences than a loader counts
        message = refusal(result, overrides)
        assert message.startswith(f"model.token_budget {budget} gives {steps} updates"), message
        assert check_advice(functools.partial(fit, where=tmp_path), overrides, message) == 1
        return
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"= {per_update:,} targets per update) = {steps:,} updates" in result.stderr, (
        result.stderr[-2000:]
    )
