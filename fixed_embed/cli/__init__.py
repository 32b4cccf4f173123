"""The ``fixed-embed`` command: a module per sub-command, each ``run(argv) -> int`` (argv[0]:
its name), importing torch and Lightning after parsing, so ``--help`` and usage errors are
instant. User errors: docs/user-errors.md."""

from __future__ import annotations

import argparse
import contextlib
import errno
import importlib
import io
import os
import pkgutil
import re
import sys
from typing import NoReturn

from fixed_embed.errors import RunWriteError, UserError, causes, environment_error, write_refused
from fixed_embed.run import console

# A command per module of this package (lm_eval.py: lm-eval), but train.py's three: fit, validate
# and test.
COMMANDS = dict.fromkeys(("fit", "validate", "test"), "fixed_embed.cli.train") | {
    m.name.replace("_", "-"): f"{__name__}.{m.name}"
    for m in pkgutil.iter_modules(__path__)
    if m.name != "train"
}

USAGE = """usage: fixed-embed COMMAND [ARGS]

commands:
  fit|validate|test   train or score a model (Lightning CLI; --config EXPERIMENT.yaml, --help)
  params CONFIG       parameter and FLOP report of an experiment, built on the meta device
  tokenizer           train a byte-level BPE (--data, --vocab-size, --out); cached
  pretokenize         text -> token shards for data.train (--data, --tokenizer, --out, --workers)
  eval CKPT           lm-eval benchmark suite (--suite paper|offline, --tasks, --limit, --hf MODEL)
  table RESULTS...    merge eval results into one paper-format Markdown table
  export CKPT OUT     Hugging Face LlamaForCausalLM folder (fixed codes written as embed_tokens)
  consolidate DIR OUT one checkpoint file from a sharded (FSDP2) checkpoint folder
  analyze probe|ablate CKPT...  identity probes across depth / one-block ablations (JSON + PNG)
  lm-eval ARGS        lm-eval's own CLI with --model fixed_embed registered
  generate CKPT       continue --prompt TEXT with a trained model (greedy or sampled, --help)
  prefetch            on a login node: cache the paper suite's data and tokenizer for offline nodes
"""
# what a command's refused write (no space, ulimit -f, permission) leaves; fit's:
# fixed_embed/cli/train.py
KEPT = {
    "pretokenize": "the finished shards are kept: the same command continues from them",
    "eval": "no file is left half-written (writes are atomic); an evaluation that ran printed its "
    "scores above",
}


class CommandParser(argparse.ArgumentParser):
    """A sub-command's parser: a usage error (an unknown choice, a missing argument) is one
    line, not the usage."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (--help lists the options)\n")


def main(argv: list[str] | None = None) -> int:
    """Run ``fixed-embed ARGV``; returns the exit status. The process-wide console set-up is done
    only when ``argv`` is None (from ``sys.argv``), so an in-process caller (tests) keeps its own
    logging."""
    configure_console = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv or os.environ.get("FIXED_EMBED_DEBUG", "") not in ("", "0")
    argv = [a for a in argv if a != "--debug"]
    if debug:
        # Lightning's DDP launcher re-runs this command line for the other ranks, without --debug.
        os.environ["FIXED_EMBED_DEBUG"] = "1"
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE, end="")
        return 0
    command = argv[0]
    if command not in COMMANDS:
        print(f"fixed-embed: unknown command {command!r}\n\n{USAGE}", end="", file=sys.stderr)
        return 2
    if configure_console:  # before the command's imports: see fixed_embed/run/console.py
        console.setup(command)
    # only the command run: its imports, no other's
    module = importlib.import_module(COMMANDS[command])
    # help comes from docstrings: printed without their markup (``x``, :class:`x`)
    help_text = io.StringIO()
    try:
        with (
            contextlib.redirect_stdout(help_text)
            if {"-h", "--help"} & set(argv)
            else contextlib.nullcontext()
        ):
            return module.run(argv) or 0
    except Exception as error:
        if (user_error := _user_error(error, argv)) is None or debug:
            raise
        console.forget_unwritten()
        if not getattr(user_error, "printed", False):
            print(
                f"fixed-embed {command}: error: {_message(user_error)}\n"
                "(--debug shows the traceback)",
                file=sys.stderr,
            )
        return getattr(user_error, "exit_status", 2)
    except KeyboardInterrupt as stop:
        print(
            f"fixed-embed {command}: interrupted ({stop.args[0] if stop.args else 'Ctrl-C'})",
            file=sys.stderr,
        )
        return 130
    finally:
        print(re.sub(r"(:[a-z]+:)?`+", "", help_text.getvalue()), end="")


def _user_error(error: BaseException, argv: list[str]) -> UserError | None:
    """The user's mistake behind ``error`` (None: a bug); Lightning's clean-up after a failed run
    can raise again, hiding it in the context."""
    if user_error := next((c for c in causes(error) if isinstance(c, UserError)), None):
        return user_error
    if (written := environment_error(error)) is not None:  # not a bug
        if written.errno in (errno.EACCES, errno.EPERM) and os.path.exists(written.filename or ""):
            return UserError(
                f"cannot read {written.filename}: {written.strerror}; check its permissions"
            )
        kept = KEPT.get(argv[0], "no file is left half-written (writes are atomic)")
        return RunWriteError(write_refused(written, kept, "choose another output path"))
    if (named := _named_path_error(error, argv)) is not None:
        return UserError(f"cannot use {named.filename}: {named.strerror}")
    return None


def _named_path_error(error: BaseException, argv: list[str]) -> OSError | None:
    """An OSError (not found, not a folder, is a folder, exists) on a path of the command line,
    or under one."""
    named = [os.path.abspath(a.split("=", 1)[-1]) for a in argv[1:] if a.split("=", 1)[-1]]
    for cause in causes(error):
        if isinstance(cause, OSError) and isinstance(cause.filename, (str, os.PathLike)):
            target = os.path.abspath(cause.filename)
            if any(
                target == p or target.startswith(p + os.sep) or p.startswith(target + os.sep)
                for p in named
            ):
                return cause
    return None


def _message(error: BaseException) -> str:
    """The error's own message; from a DataLoader worker, torch re-raises it wrapped in the
    worker's traceback."""
    text = str(error)
    if "Original Traceback" not in text:
        return text
    last = text.strip().splitlines()[-1]
    return last.removeprefix(f"{type(error).__module__}.{type(error).__name__}: ")
