"""A plan's runs as jobs (executor.py), their rows merged into one runs file by this
launch alone.

A run's job fits it (``--ckpt_path last``: from its checkpoint when it has one) and writes its
row beside it (``<logs>/<name>/row.json``); the launch holding the runs file merges the rows, so
no two processes write it. Each job's id goes to ``OUT-jobs.json``: a launch killed and started
again with the same command attaches to the jobs still queued or running, merges the rows of
those that finished meanwhile and submits the rest again, which resume from their checkpoints
(docs/cluster.md).
"""

from __future__ import annotations

import json
import signal
from collections import Counter
from pathlib import Path
from typing import Any

import submitit
from rich.console import Console

from experiments.launch import fit, runs_file
from experiments.launch.executor import STOPPING, Runs, executor_for, stop_fits
from fixed_embed.atomic import atomic_write_text
from fixed_embed.config import DEFAULT_RUN
from fixed_embed.run.lock import LOCK_NAME, RunInUseError, acquire

ROW = "row.json"


def row_file(logs: str, name: str) -> Path:
    return Path(logs) / name / ROW


def read_row(logs: str, name: str, extra: list[str]) -> dict | None:
    """The row a finished job wrote for ``name``; one of other flags is refused as a runs file's
    is."""
    try:
        row = json.loads(row_file(logs, name).read_text())
    except (OSError, ValueError):
        return None
    _same_flags(row, name, extra, row_file(logs, name))
    return row


def _same_flags(row: dict, name: str, extra: list[str], where: Path | str) -> None:
    if row.get("extra", extra) != extra:
        raise ValueError(
            f"{where} already has a run {name!r} with flags {row['extra']}, not {extra}; write to "
            "another --out and --logs (or remove that row to re-run it)"
        )


class Stopped(Exception):
    """The fit was stopped before its length (SIGTERM, a time limit): its checkpoint resumes it."""


class FitJob(submitit.helpers.Checkpointable):
    """One run's job: its fit, then its row file. Warned before a time limit, it stops the fit
    (which saves) and submitit requeues the job, which resumes the fit."""

    def __call__(self, name: str, config: Any, logs: str, extra: list[str], **options: Any) -> str:
        """``options``: fit.run's."""
        _wait_for(Path(logs) / name / DEFAULT_RUN)
        row = fit.run(name, config, logs, extra, **options)
        if row is None:
            raise Stopped(
                f"{name} was stopped before its length; the same command resumes it from its "
                "checkpoint"
            )
        atomic_write_text(row_file(logs, name), json.dumps(row, indent=1) + "\n")
        return name

    def checkpoint(self, *args: Any, **kwargs: Any) -> submitit.helpers.DelayedSubmission:
        stop_fits()
        return super().checkpoint(*args, **kwargs)


def _wait_for(run_dir: Path) -> None:
    """Until no other launch holds the run (a fit left running by a launch killed with SIGKILL)."""
    said = False
    while True:
        try:
            acquire(run_dir).release()
            return
        except RunInUseError as held:
            if not said:
                print(f"waiting for {run_dir}: {held}", flush=True)
                said = True
            if STOPPING.wait(10.0):  # seconds between looks
                raise Stopped(f"{run_dir}: the launch was stopped while waiting for it") from None


def _finished_rows(
    planned: dict[str, list[str]], logs: str, out: str | None
) -> tuple[list[dict], dict[str, dict], bool]:
    """The runs file's rows of other plans (kept), this plan's finished rows, and whether any of
    these comes from a row file no launch merged yet."""
    done: dict[str, dict] = {}
    if out:  # held before any job: a second launch on this --out would train the same rows
        runs_file.hold(f"{out}.json")
        done = runs_file.rows_by_name(out)
    kept = [row for name, row in done.items() if name not in planned]
    rows = {name: done[name] for name in planned if name in done}
    # a finished row stands in for a run only if it ran the same flags
    for name, row in rows.items():
        _same_flags(row, name, planned[name], f"{out}.json")
    unmerged = {n: read_row(logs, n, extra) for n, extra in planned.items() if n not in rows}
    merged = {name: row for name, row in unmerged.items() if row is not None}
    return kept, rows | merged, bool(merged)


def run_all(
    plan: list[tuple], logs: str, title: str, out: str | None, runs: Runs, **options: Any
) -> list[dict]:
    """Run the plan's missing rows as jobs on ``runs``, ``runs.jobs`` at a time, each fit with
    ``options`` (fit.run's ``evaluate``, ``eval_device``); rows keep the plan's order."""
    planned = {name: extra for name, _, extra in plan}
    kept, rows, merged = _finished_rows(planned, logs, out)

    def save() -> None:
        if out:
            runs_file.write_rows(kept + [rows[n] for n in planned if n in rows], title, out)

    if merged:
        save()
    failed = {}
    for name in [n for n in planned if n not in rows and runs.attach(n)]:
        print(f"{name}: attached to {runs.name} job {runs.records[name]['job']}", flush=True)
    queue = [step for step in plan if step[0] not in rows and step[0] not in runs.active]
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        while runs.active or (queue and not failed):
            while queue and len(runs.active) < runs.jobs and not failed:
                name, config, extra = queue.pop(0)
                runs.submit(
                    name, FitJob(), name, config, logs, extra, threads=runs.threads, **options
                )
            runs.wait()
            for name, row, failure in runs.ended(lambda n: read_row(logs, n, planned[n])):
                if row is not None:
                    rows[name] = row
                    save()
                else:  # reported once; the same command submits it again (a preempted one resumes)
                    failed[name] = failure
                    print(f"run {name} failed: {failure}", flush=True)
    except KeyboardInterrupt as stop:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second one while the fits save
        stopped = stop_fits()
        going = (
            f"its {len(runs.active)} jobs go on"
            if runs.name == "slurm"
            else f"{stopped} running fits saved their checkpoints"
        )
        raise SystemExit(
            f"{title}: stopped ({stop}); {going} and {len(rows)} of {len(plan)} rows are done; "
            "the same command continues"
        ) from None
    finally:
        signal.signal(signal.SIGTERM, previous)
        runs.shutdown()
    if failed:
        lines = [f"  {name}: {why}" for name, why in failed.items()]
        raise SystemExit(
            f"{title}: {len(failed)} runs failed (finished rows kept; the same command runs the "
            "failed ones again, from their checkpoints):\n" + "\n".join(lines)
        )
    ordered = [rows[name] for name in planned]
    Console(width=150).print(runs_file.table(ordered, title))
    return ordered


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def status(plan: list[tuple], logs: str, out: str | None, runs: Runs) -> list[str]:
    """One line per planned run: finished, running, queued, failed or stopped (job id and log),
    or not started."""
    finished, lines, counts = runs_file.rows_by_name(out) if out else {}, [], Counter()
    for name, _, _ in plan:
        record, run_dir = runs.records.get(name, {}), Path(logs) / name / DEFAULT_RUN
        if name in finished:
            state = "finished"
        elif row_file(logs, name).is_file():
            state = "finished (row not merged yet)"
        elif (job := runs.job(record)) is not None:
            state = f"{runs.state(job).lower()} (job {record['job']}, log {record['log']})"
        elif (run_dir / LOCK_NAME).is_file():
            state = f"running ({(run_dir / LOCK_NAME).read_text()[:120]})"
        elif (run_dir / "checkpoints").is_dir():
            state = f"stopped, resumes from {run_dir / 'checkpoints'}"
        else:
            state = "not started"
        counts[state.split(" (")[0].split(",")[0]] += 1
        lines.append(f"{name:48s} {state}")
    lines.append(", ".join(f"{n} {state}" for state, n in counts.items()) + f" of {len(plan)} runs")
    return lines


def launch(
    plan: list[tuple], logs: str, title: str, out: str | None, args: Any, **options: Any
) -> None:
    """A runner's plan on the executor its flags chose (executor.py), or its ``--status``."""
    runs = executor_for(args, Path(logs) / "jobs", Path(f"{out}-jobs.json") if out else None)
    if args.status:
        print("\n".join(status(plan, logs, out, runs)))
    else:
        run_all(plan, logs, title, out, runs, **options)
