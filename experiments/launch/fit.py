"""The fit of one run: `fixed-embed fit` in its own process, and the run's row read back from its
TensorBoard events (final validation loss and perplexity, trainable parameters, wall time,
tokens/s, its log folder, exact arguments and commit). With ``evaluate``, a suite of
``fixed_embed.evaluation.suite`` scores the run's final checkpoint and its scores join the row.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from experiments.launch.executor import ROOT, ended, started
from experiments.launch.record import Configs, run_record

# kept in each row, for plots
CURVES = (
    "train/loss",
    "val/loss",
    "val/bits_per_byte",
    "input/norm_mean",
    "perf/tokens_per_sec",
)


def curves(run_dir: Path, tags: Sequence[str] | None = CURVES) -> dict[str, list[list[float]]]:
    """``{tag: [[step, value], ...]}`` for the ``tags`` the run logged (None: every one)."""
    events = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    events.Reload()
    logged = events.Tags()["scalars"]
    return {
        tag: [[s.step, s.value] for s in events.Scalars(tag)]
        for tag in (logged if tags is None else tags)
        if tag in logged
    }


def tokens_seen(run_dir: Path) -> int:
    """Prediction tokens the run trained on, from its last checkpoint."""
    import torch

    return torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)[
        "tokens_seen"
    ]


def run(
    name: str,
    config: Configs,
    logs: str,
    extra: list[str],
    threads: int | None = None,
    evaluate: str | None = None,
    eval_device: str = "cpu",
) -> dict | None:
    """Fit ``config`` (plus ``extra`` flags) with its logs under ``logs/<name>``; return its row
    (None: the fit was stopped before its length, and its checkpoint resumes it).

    ``threads`` sets the fit's OMP/torch threads; ``evaluate`` names a suite to score the final
    checkpoint with (``fixed-embed eval``, results under the run's ``eval/`` folder).
    """
    from fixed_embed.config import DEFAULT_RUN

    configs = [config] if isinstance(config, Path) else list(config)
    # A fit is one task that starts its own ranks: with SLURM_NTASKS set (a SLURM job, an
    # allocation), Lightning would take srun to have started them all.
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)} if threads else dict(os.environ)
    env.pop("SLURM_NTASKS", None)
    run_dir = Path(logs) / name / DEFAULT_RUN
    # The code the run starts from, and whether a checkpoint of an earlier attempt is resumed (its
    # wall time and tokens/s then cover this attempt only).
    commit, dirty, resumed = git_commit(), code_changed(), _resumes(run_dir)
    start = time.perf_counter()
    _fit(_command(name, configs, logs, extra), env, run_dir)
    seconds = time.perf_counter() - start
    if not finished(run_dir):
        return None
    logged, seen = curves(run_dir), tokens_seen(run_dir)
    val_loss = logged["val/loss"][-1][1]
    row = {
        "name": name,
        "config": " + ".join(str(Path(path).resolve().relative_to(ROOT)) for path in configs),
        "extra": extra,
        "trainable_params": run_record(run_dir).trainable,
        "val_loss": val_loss,
        "val_ppl": math.exp(val_loss),
        "val_bpb": logged["val/bits_per_byte"][-1][1] if "val/bits_per_byte" in logged else None,
        "tokens_seen": seen,
        "tokens_per_sec": None if resumed else seen / seconds,
        "wall_seconds": seconds,
        "resumed": resumed,
        "threads": threads,
        "logs": str(run_dir),
        "commit": commit,
        "code_changed": dirty,
        "curves": logged,
    }
    if evaluate:
        row["scores"], row["scored"] = evaluate_run(run_dir, name, evaluate, env, eval_device)
    return row


def _command(name: str, configs: list[Path], logs: str, extra: list[str]) -> list[str]:
    # --ckpt_path last: a row interrupted earlier continues from its checkpoint instead of being
    # refused.
    return [
        sys.executable,
        "-m",
        "fixed_embed",
        "fit",
        *[arg for path in configs for arg in ("--config", str(path))],
        f"--trainer.logger.init_args.save_dir={logs}",
        f"--trainer.logger.init_args.name={name}",
        "--ckpt_path=last",
        *extra,
    ]


def _resumes(run_dir: Path) -> bool:
    """Whether fit's ``--ckpt_path last`` resumes a checkpoint (one rule:
    ``fixed_embed.train.resume.choose_checkpoint``)."""
    from fixed_embed.errors import CheckpointError
    from fixed_embed.train.resume import choose_checkpoint

    try:
        return choose_checkpoint(run_dir / "checkpoints")[0] is not None
    except CheckpointError:  # a stale last.ckpt: there is a run, and the fit says why it refuses it
        return True


def _fit(args: list[str], env: dict[str, str], run_dir: Path) -> None:
    """The fit's process, until it exits (0: finished, or stopped and saved)."""
    # The fit starts with SIGUSR2 blocked: SLURM's warning before a time limit reaches every
    # process of a job, and is the job's (grid.py FitJob), which stops the fit with
    # SIGTERM once, as it should be. In a process group of its own: Ctrl-C reaches the launch
    # alone, which stops its fits with SIGTERM (they save).
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR2})
    try:
        fit = subprocess.Popen(args, cwd=ROOT, env=env, process_group=0)
        # a SIGTERM to this launch (or a job's time limit) stops it: it saves and exits 0
        started(fit)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    try:
        if fit.wait():
            raise RuntimeError(
                f"fit exited with status {fit.returncode}; its log: {run_dir / 'console.log'}"
            )
    finally:
        ended(fit)


def finished(run_dir: Path) -> bool:
    """Whether the run reached its length, that of the config it saved (a fit stopped early by
    SIGTERM exits 0 as well, after saving)."""
    from fixed_embed.train.resume import read_checkpoint

    steps = run_record(run_dir).updates  # None: a length in epochs, which the fit's exit says
    return (
        steps is None
        or read_checkpoint(run_dir / "checkpoints" / "last.ckpt")["global_step"] >= steps
    )


def evaluate_run(
    run_dir: Path, name: str, suite: str, env: dict[str, str], device: str
) -> tuple[dict, dict]:
    """Score ``run_dir``'s last checkpoint on ``suite``: its ``{column key: {value, stderr}}``,
    and what was scored (the checkpoint file ``last.ckpt`` resolved to, and its update)."""
    out, options = run_dir / "eval", ("--suite", suite, "--device", device, "--batch-size", "32")
    args = eval_command(run_dir / "checkpoints" / "last.ckpt", out, *options, "--name", name)
    subprocess.run(args, check=True, cwd=ROOT, env=env, stdout=subprocess.DEVNULL)
    results = json.loads((out / "results.json").read_text())
    return results["scores"], {key: results[key] for key in ("checkpoint", "update")}


def eval_command(checkpoint: Path, out: Path, *options: str) -> list[str]:
    """``fixed-embed eval`` of ``checkpoint``, its results into the folder ``out`` (replaced)."""
    return [
        sys.executable,
        "-m",
        "fixed_embed",
        "eval",
        str(checkpoint),
        "--output",
        str(out),
        "--overwrite",
        *options,
    ]


def git_commit() -> str:
    return subprocess.run(
        ["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=ROOT
    ).stdout.strip()


def code_changed() -> bool:
    """Whether the code or configs differ from the commit (results files written by a running
    study do not count)."""
    paths = ["fixed_embed", "callbacks", "experiments", "pyproject.toml"]
    status = subprocess.run(
        ["git", "status", "--porcelain", "--", *paths], capture_output=True, text=True, cwd=ROOT
    )
    return bool(status.stdout.strip())
