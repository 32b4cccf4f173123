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

import concurrent.futures
import json
import signal
import threading
import time
from pathlib import Path
from typing import Any

import submitit
from rich.console import Console

from experiments.launch import fit, runs_file
from experiments.launch.executor import (
    LIVE,
    STOPPING,
    LocalRuns,
    SlurmRuns,
    executor_for,
    stop_fits,
)
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

    def __call__(
        self,
        name: str,
        config: Any,
        logs: str,
        extra: list[str],
        evaluate: str | None,
        eval_device: str,
        threads: int | None,
    ) -> str:
        _wait_for(Path(logs) / name / DEFAULT_RUN)
        row = fit.run(
            name, config, logs, extra, threads=threads, evaluate=evaluate, eval_device=eval_device
        )
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


def _wait_for(run_dir: Path, every_s: float = 10.0) -> None:
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
            if STOPPING.wait(every_s):
                raise Stopped(f"{run_dir}: the launch was stopped while waiting for it") from None


def _records(out: str | None) -> dict[str, dict]:
    try:
        return json.loads(Path(f"{out}-jobs.json").read_text()) if out else {}
    except (OSError, ValueError):
        return {}


def run_all(
    plan: list[tuple],
    logs: str,
    title: str,
    out: str | None = None,
    jobs: int = 1,
    evaluate: str | None = None,
    eval_device: str = "cpu",
    executor: LocalRuns | SlurmRuns | None = None,
) -> list[dict]:
    """Run the plan's missing rows as jobs, ``jobs`` at a time (or ``executor``'s); rows keep
    the plan's order."""
    executor = executor or LocalRuns(jobs)
    done: dict[str, dict] = {}
    if out:
        runs_file.hold(
            f"{out}.json"
        )  # before any job: a second launch on this --out would train the same rows
        if Path(f"{out}.json").is_file():
            done = {row["name"]: row for row in runs_file.read_runs(f"{out}.json")["runs"]}
    planned = {name: extra for name, _, extra in plan}
    kept = [
        row for name, row in done.items() if name not in planned
    ]  # earlier runs outside this plan stay
    rows = {name: done[name] for name in planned if name in done}
    for (
        name,
        row,
    ) in rows.items():  # a finished row stands in for a run only if it ran the same flags
        _same_flags(row, name, planned[name], f"{out}.json")
    unmerged = {
        name: read_row(logs, name, extra) for name, extra in planned.items() if name not in rows
    }
    merged = {
        name: row for name, row in unmerged.items() if row is not None
    }  # finished while no launch merged
    rows.update(merged)

    def save() -> None:
        if out:
            runs_file.write_rows(
                kept + [rows[name] for name in planned if name in rows], title, out
            )

    if merged:
        save()
    records, active, failed = _records(out), {}, {}
    for name in planned:
        if name not in rows and (handle := executor.attach(records.get(name, {}))) is not None:
            active[name] = handle
            print(f"{name}: attached to {executor.name} job {records[name].get('job')}", flush=True)
    queue = [step for step in plan if step[0] not in rows and step[0] not in active]
    interrupt = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _interrupt) if interrupt else None
    try:
        while active or (queue and not failed):
            while queue and len(active) < executor.jobs and not failed:
                name, config, extra = queue.pop(0)
                active[name] = executor.submit(
                    FitJob(), name, config, logs, extra, evaluate, eval_device
                )
                records[name] = executor.record(active[name])
                if out:
                    atomic_write_text(f"{out}-jobs.json", json.dumps(records, indent=1) + "\n")
            _wait(executor, list(active.values()))
            for name, handle in list(active.items()):
                row = read_row(logs, name, planned[name])
                if row is None and executor.state(handle) in LIVE:
                    continue
                del active[name]
                if row is not None:
                    rows[name] = row
                    save()
                else:  # reported once; the same command submits it again (a preempted one resumes)
                    failed[name] = executor.failure(handle)
                    print(f"run {name} failed: {failed[name]}", flush=True)
    except KeyboardInterrupt as stop:
        if interrupt:  # a second SIGTERM while the fits save does not cut this short
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        stopped = stop_fits()
        going = (
            f"its {len(active)} jobs go on"
            if isinstance(executor, SlurmRuns)
            else f"{stopped} running fits saved their checkpoints"
        )
        raise SystemExit(
            f"{title}: stopped ({stop}); {going} and {len(rows)} of {len(plan)} "
            "rows are done; the same command continues"
        ) from None
    finally:
        if interrupt:
            signal.signal(signal.SIGTERM, previous)
        executor.shutdown()
    if failed:
        lines = [f"  {name}: {why}" for name, why in failed.items()]
        raise SystemExit(
            "\n".join(
                [
                    f"{title}: {len(failed)} runs failed (finished rows kept; the same command "
                    "runs the failed ones again, from their checkpoints):",
                    *lines,
                ]
            )
        )
    ordered = [rows[name] for name in planned]
    Console(width=150).print(runs_file.table(ordered, title))
    return ordered


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def _wait(executor: LocalRuns | SlurmRuns, handles: list) -> None:
    if isinstance(executor, LocalRuns):
        concurrent.futures.wait(
            handles, timeout=5.0, return_when=concurrent.futures.FIRST_COMPLETED
        )
    elif handles:
        time.sleep(executor.poll_s)
        executor.refresh()


def status(
    plan: list[tuple], logs: str, out: str | None, executor: LocalRuns | SlurmRuns
) -> list[str]:
    """One line per planned run: finished, running, queued, failed or stopped (job id and log),
    or not started."""
    finished = set()
    if out and Path(f"{out}.json").is_file():
        finished = {row["name"] for row in runs_file.read_runs(f"{out}.json")["runs"]}
    records, lines, counts = _records(out), [], {}
    for name, _, _ in plan:
        record, run_dir = records.get(name, {}), Path(logs) / name / DEFAULT_RUN
        if name in finished:
            state = "finished"
        elif row_file(logs, name).is_file():
            state = "finished (row not merged yet)"
        elif record.get("executor") == "slurm" and isinstance(executor, SlurmRuns):
            job = submitit.SlurmJob(folder=executor.folder / "%j", job_id=str(record["job"]))
            state = f"{executor.state(job).lower()} (job {record['job']}, log {record['log']})"
        elif (run_dir / LOCK_NAME).is_file():
            state = f"running ({(run_dir / LOCK_NAME).read_text()[:120]})"
        elif (run_dir / "checkpoints").is_dir():
            state = f"stopped, resumes from {run_dir / 'checkpoints'}"
        else:
            state = "not started"
        key = state.split(" (")[0].split(",")[0]
        counts[key] = counts.get(key, 0) + 1
        lines.append(f"{name:48s} {state}")
    lines.append(", ".join(f"{n} {state}" for state, n in counts.items()) + f" of {len(plan)} runs")
    return lines


def launch(
    plan: list[tuple], logs: str, title: str, out: str | None, args: Any, **options: Any
) -> list[dict]:
    """A runner's plan on the executor its flags chose (executor.py), or its
    ``--status``."""
    executor = executor_for(args, Path(logs) / "jobs")
    if args.status:
        print("\n".join(status(plan, logs, out, executor)))
        return []
    return run_all(plan, logs, title, out, executor=executor, **options)
