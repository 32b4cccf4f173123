"""Run ``fixed-embed ARGV`` inside the test process: the same parser, configs and checks as the
command.

A ``fit --print_config`` in a fresh interpreter costs ~14 s of imports; in-process it is a parse
(~0.3 s). The exit status is what the command would exit with: ``main``'s return value, or the
code of the ``SystemExit`` that jsonargparse raises for ``--print_config``, ``--help`` and usage
errors. Only what needs a process of its own (signals, the console set-up, multi-process launches)
starts one.
"""

from __future__ import annotations

import contextlib
import io
import logging
import sys
from dataclasses import dataclass
from unittest import mock

import yaml

from fixed_embed.cli import main


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str

    def config(self) -> dict:
        """The YAML that ``--print_config`` printed."""
        assert self.returncode == 0, self.stderr[-2000:]
        return yaml.safe_load(self.stdout)


def run_cli(*argv: str) -> Result:
    """``stderr`` also holds the INFO log lines (``resuming ...``, ``resume: ...``), which the
    command's own console set-up would print there."""
    out, err = io.StringIO(), io.StringIO()
    handler = logging.StreamHandler(err)
    handler.setLevel(logging.INFO)
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        # sys.argv as the command would see it: LightningCLI warns when it also holds pytest's
        # arguments.
        with (
            contextlib.redirect_stdout(out),
            contextlib.redirect_stderr(err),
            mock.patch.object(sys, "argv", ["fixed-embed"]),
        ):
            try:
                code = main([str(a) for a in argv])
            except SystemExit as stop:
                code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    finally:
        root.removeHandler(handler)
    return Result(code or 0, out.getvalue(), err.getvalue())


def print_config(*argv: str) -> dict:
    """The composed config of ``fixed-embed fit ARGV --print_config``, parsed."""
    return run_cli("fit", *argv, "--print_config").config()
