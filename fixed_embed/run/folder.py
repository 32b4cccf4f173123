"""A run's folder, the same on every launch: name, checkpoints, curve (docs/faults.md, "Runs and
relaunches")."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from fixed_embed.errors import ConfigError

LAST = "last.ckpt"  # a link to the newest step=N.ckpt
_STEP = re.compile(r"step=(\d+)")


def checkpoint_folder(run: Path) -> Path:
    return run / "checkpoints"


def step_checkpoint(folder: Path, step: int) -> Path:
    """The checkpoint of update ``step`` in ``folder``: step=00001000.ckpt, names sorting by
    update."""
    return folder / f"step={step:08d}.ckpt"


def benchmark_folder(run: Path, step: int) -> Path:
    """Where the in-loop benchmark at update ``step`` writes its results."""
    return run / "benchmarks" / f"step_{step:08d}"


def step_of(path: str | os.PathLike) -> int | None:
    """The update a ``step=N`` checkpoint was saved at (None: not such a name)."""
    match = _STEP.search(Path(path).name)
    return int(match.group(1)) if match else None


def step_checkpoints(folder: Path) -> list[Path]:
    """The ``step=N.ckpt`` checkpoints in ``folder``, oldest first."""
    return sorted((p for p in folder.glob("step=*.ckpt") if step_of(p) is not None), key=step_of)


def pin_run_folder(trainer: Any, run: str) -> Path | None:
    """Give the ``trainer:`` config's logger the run's name as its version; the run folder
    (None: no file logger)."""
    if not run or "/" in run or run in (".", "..") or "\0" in run:
        raise ConfigError(f"--run must be a plain folder name, got {run!r}")
    if len(os.fsencode(run)) > 255:
        raise ConfigError(
            f"--run is {len(os.fsencode(run))} bytes long; a folder name may have at most 255 "
            "(NAME_MAX): "
            "choose a shorter run name"
        )
    init_args = getattr(trainer.logger, "init_args", None)
    if init_args is None or not hasattr(init_args, "save_dir"):
        return None
    init_args.version = run
    return Path(init_args.save_dir) / (getattr(init_args, "name", None) or "") / run
