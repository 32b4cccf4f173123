"""Run experiment configs one after another, each `fixed-embed fit` in its own process, and
tabulate them.

Used by `make demo`, `make controls` and `make sweep-recodings`. A run's row (final validation loss
and perplexity, trainable parameters, wall time, tokens/s, its log folder and exact arguments) is
read back from its TensorBoard events. With ``--out``, rows go to ``OUT.json`` after every run
(completed runs are skipped when the command is repeated, so a long sweep resumes) and the table
to ``OUT.md`` with the git commit that produced it. ``jobs`` runs several fits at once, the cores
split between them (on 2 cores, two 1-thread fits train ~7 % more tokens/s than one 2-thread fit
and overlap each other's start-up and evaluation). With ``evaluate``, a suite of
``fixed_embed.evaluation.suite`` scores each run's final checkpoint and its scores join the row.
"""

from __future__ import annotations

import functools
import json
import math
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from rich.table import Table
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from experiments.executor import ended, started
from fixed_embed.atomic import atomic_write_text
from fixed_embed.errors import UserError
from fixed_embed.run.lock import RunLock, acquire

ROOT = Path(__file__).resolve().parents[1]


CURVES = (
    "train/loss",
    "val/loss",
    "val/bits_per_byte",
    "input/norm_mean",
    "perf/tokens_per_sec",
)  # kept in each row, for plots


def curves(run_dir: Path, tags: Sequence[str] = CURVES) -> dict[str, list[list[float]]]:
    """``{tag: [[step, value], ...]}`` for the tags the run logged."""
    events = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    events.Reload()
    logged = set(events.Tags()["scalars"])
    return {tag: [[s.step, s.value] for s in events.Scalars(tag)] for tag in tags if tag in logged}


def tokens_seen(run_dir: Path) -> int:
    """Prediction tokens the run trained on, from its last checkpoint."""
    import torch

    return torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)[
        "tokens_seen"
    ]


Configs = (
    Path | Sequence[Path]
)  # one experiment file, or several merged in order (a variant, then deltas)


def merged_config(configs: Sequence[str | Path]) -> dict:
    """The experiment that ``--config A --config B ...`` gives: each file (with its bases)
    merged in order."""
    from fixed_embed.config import deep_merge, load_experiment

    merged, named = {}, {}
    for path in configs:
        merged = deep_merge(merged, load_experiment(path, named))
    return merged


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
    from fixed_embed.errors import CheckpointError
    from fixed_embed.run.resume_plan import choose_checkpoint
    from fixed_embed.train.experiment import build_model

    configs = [config] if isinstance(config, Path) else list(config)
    # A fit is one task that starts its own ranks: with SLURM_NTASKS set (a SLURM job, an
    # allocation), Lightning would take srun to have started them all.
    env = {key: value for key, value in os.environ.items() if key != "SLURM_NTASKS"}
    env.update({"OMP_NUM_THREADS": str(threads)} if threads else {})
    logger = [
        f"--trainer.logger.init_args.save_dir={logs}",
        f"--trainer.logger.init_args.name={name}",
    ]
    config_args = [arg for path in configs for arg in ("--config", str(path))]
    # --ckpt_path last: a row interrupted earlier continues from its checkpoint instead of being
    # refused.
    args = [
        sys.executable,
        "-m",
        "fixed_embed",
        "fit",
        *config_args,
        *logger,
        "--ckpt_path=last",
        *extra,
    ]
    run_dir = Path(logs) / name / DEFAULT_RUN
    # The code the run starts from, and whether a checkpoint of an earlier attempt is resumed (its
    # wall time and tokens/s then cover this attempt only).
    commit, dirty = _git_commit(), _code_changed()
    # what fit's --ckpt_path last resumes (one rule: fixed_embed.run.resume_plan.choose_checkpoint)
    try:
        resumed = choose_checkpoint(run_dir / "checkpoints")[0] is not None
    except CheckpointError:  # a stale last.ckpt: there is a run, and the fit says why it refuses it
        resumed = True
    start = time.perf_counter()
    # The fit starts with SIGUSR2 blocked: SLURM's warning before a time limit reaches every
    # process of a job, and is the job's (experiments/grid.py FitJob), which stops the fit with
    # SIGTERM once, as it should be. In a process group of its own: Ctrl-C reaches the launch
    # alone, which stops its fits with SIGTERM (they save).
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR2})
    try:
        fit = subprocess.Popen(args, cwd=ROOT, env=env, process_group=0)
        started(
            fit
            # a SIGTERM to this launch (or a job's time limit) stops it: it saves and exits 0, not
            # finished
        )
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    try:
        if fit.wait():
            raise RuntimeError(
                f"fit exited with status {fit.returncode}; its log: {run_dir / 'console.log'}"
            )
    finally:
        ended(fit)
    seconds = time.perf_counter() - start
    if not finished(run_dir):
        return None
    model_config = merged_config(configs).get("model") or {}
    for flag in extra:  # model options given on the command line change the model too
        if flag.startswith(("--model.interface.init_args.", "--model.decoder.")):
            path, value = flag.removeprefix("--model.").split("=", 1)
            *parents, key = path.split(".")
            node = model_config
            for parent in parents:
                node = node.setdefault(parent, {})
            node[key] = json.loads(value)
    trainable = sum(p.numel() for p in build_model(model_config).parameters() if p.requires_grad)
    logged, seen = curves(run_dir), tokens_seen(run_dir)
    val_loss = logged["val/loss"][-1][1]
    row = {
        "name": name,
        "config": " + ".join(str(Path(path).resolve().relative_to(ROOT)) for path in configs),
        "extra": extra,
        "trainable_params": trainable,
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


def finished(run_dir: Path) -> bool:
    """Whether the run reached its length, ``trainer.max_steps`` of the config it saved (a fit
    stopped early by SIGTERM exits 0 as well, after saving)."""
    import yaml

    from fixed_embed.run.resume_plan import read_checkpoint

    steps = (yaml.safe_load((run_dir / "config.yaml").read_text()).get("trainer") or {}).get(
        "max_steps"
    )
    if steps is None or steps < 0:  # a length in epochs: the fit's exit says it
        return True
    return read_checkpoint(run_dir / "checkpoints" / "last.ckpt")["global_step"] >= steps


def evaluate_run(
    run_dir: Path, name: str, suite: str, env: dict[str, str], device: str = "cpu"
) -> tuple[dict, dict]:
    """Score ``run_dir``'s last checkpoint on ``suite``: its ``{column key: {value, stderr}}``,
    and what was scored (the checkpoint file ``last.ckpt`` resolved to, and its update)."""
    out = run_dir / "eval"
    args = [
        sys.executable,
        "-m",
        "fixed_embed",
        "eval",
        str(run_dir / "checkpoints" / "last.ckpt"),
        "--suite",
        suite,
        "--device",
        device,
        "--batch-size",
        "32",
        "--name",
        name,
        "--output",
        str(out),
        "--overwrite",
    ]
    subprocess.run(args, check=True, cwd=ROOT, env=env, stdout=subprocess.DEVNULL)
    results = json.loads((out / "results.json").read_text())
    return results["scores"], {key: results[key] for key in ("checkpoint", "update")}


def tiny_variants(extra: list[str]) -> list[tuple[str, Path, list[str]]]:
    """The plan for the paper's three variants at tiny scale."""
    return [
        (f"tiny/{v}", ROOT / "experiments" / "tiny" / f"{v}.yaml", extra)
        for v in ("learned", "binary16", "gf2")
    ]


def _rate(row: dict) -> str:
    """Tokens per wall second; none for a resumed run, whose wall time covers its last attempt only.

    Its ``tokens_seen`` is the whole run's, and the tokens of the last attempt are not recorded,
    so neither the run's rate nor the last attempt's is known: a resumed row shows no number
    even where it carries one.
    """
    if row.get("resumed") or row.get("tokens_per_sec") is None:
        return "resumed"
    return f"{row['tokens_per_sec']:,.0f}"


def _wall(row: dict) -> str:
    return f"{row['wall_seconds'] / 60:.1f}" + (" (last attempt)" if row.get("resumed") else "")


def table(rows: list[dict], title: str) -> Table:
    result = Table(title=title)
    for column in (
        "run",
        "trainable params",
        "final val loss",
        "val ppl",
        "tokens/s (wall)",
        "wall",
    ):
        result.add_column(column, justify="left" if column == "run" else "right")
    for r in rows:
        result.add_row(
            r["name"],
            f"{r['trainable_params']:,}",
            f"{r['val_loss']:.3f}",
            f"{r['val_ppl']:.1f}",
            _rate(r),
            f"{_wall(r)} min",
        )
    return result


def _git_commit() -> str:
    return subprocess.run(
        ["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=ROOT
    ).stdout.strip()


def _code_changed() -> bool:
    """Whether the code or configs differ from the commit (results files written by a running
    study do not count)."""
    paths = ["fixed_embed", "callbacks", "experiments", "pyproject.toml"]
    status = subprocess.run(
        ["git", "status", "--porcelain", "--", *paths], capture_output=True, text=True, cwd=ROOT
    )
    return bool(status.stdout.strip())


def read_runs(path: str | Path) -> dict:
    """A runs file (``{title, commit, runs}``), or a one-line refusal naming it: a study resumes
    from its rows, skips the runs they hold and renders its report from them, so a file it
    cannot read must stop it."""
    try:
        data = json.loads(Path(path).read_text())
        if not isinstance(data, dict) or not all(isinstance(row, dict) for row in data["runs"]):
            raise ValueError("not a {title, commit, runs: [row, ...]} object")
    except (OSError, ValueError, KeyError, TypeError) as error:
        reason = " ".join(str(error).split())[:200]
        raise SystemExit(
            f"cannot read the runs file {path} ({type(error).__name__}: {reason}): restore it "
            f"(git checkout -- {path}) or move it away to rerun its runs"
        ) from None
    return data


# held until this process exits, whatever number of run_all / write_rows calls it makes
@functools.cache
def hold(runs_file: str) -> RunLock:
    """One writer per runs file: this process, or a one-line refusal naming the live holder."""
    try:
        return acquire(Path(runs_file), "or pass another --out", beside=True)
    except UserError as error:
        raise SystemExit(str(error)) from None


def write_rows(rows: list[dict], title: str, out: str, commit: str | None = None) -> None:
    hold(f"{out}.json")
    commit = commit or _git_commit()
    # a reader (or the next launch, after a kill) never sees half a runs file: it resumes from it
    atomic_write_text(
        f"{out}.json", json.dumps({"title": title, "commit": commit, "runs": rows}, indent=2) + "\n"
    )
    note = "one `fixed-embed fit` per row; the JSON has each row's flags (`extra`) and commit"
    lines = [
        f"# {title}",
        "",
        f"commit `{commit}`; {note}.",
        "",
        "| run | trainable params | final val loss | val ppl | tokens/s | wall (min) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['name']} | {r['trainable_params']:,} | {r['val_loss']:.3f} | {r['val_ppl']:.1f} "
            "| "
            f"{_rate(r)} | {_wall(r)} |"
        )
    groups = seed_groups(rows)
    if any(len(losses) > 1 for losses in groups.values()):
        lines += [
            "",
            "Over training seeds (runs named `NAME` and `NAME-seedS`): mean ± sample sd.",
            "",
            "| run | seeds | val loss mean | sd | min | max |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for name, losses in groups.items():
            sd = statistics.stdev(losses) if len(losses) > 1 else float("nan")
            lines.append(
                f"| {name} | {len(losses)} | {statistics.mean(losses):.3f} | {sd:.3f} | "
                f"{min(losses):.3f} | {max(losses):.3f} |"
            )
    Path(f"{out}.md").write_text("\n".join(lines) + "\n")


def seed_groups(rows: list[dict]) -> dict[str, list[float]]:
    """Final validation losses grouped by run name without its ``-seedS`` suffix."""
    groups: dict[str, list[float]] = {}
    for r in rows:
        groups.setdefault(re.sub(r"-seed\d+$", "", r["name"]), []).append(r["val_loss"])
    return groups


if __name__ == "__main__":  # re-render OUT.md from OUT.json: python experiments/runs.py OUT
    data = read_runs(f"{sys.argv[1]}.json")
    write_rows(data["runs"], data["title"], sys.argv[1], commit=data["commit"])
