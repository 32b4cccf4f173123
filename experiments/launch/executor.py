"""Where a plan's runs execute: this machine (``--executor local``, the default: ``--jobs`` fits
at once sharing the cores, as ever) or a SLURM cluster (``--executor slurm``: one job per run
through submitit, requeued on a time limit or preemption). docs/cluster.md.

submitit writes the job scripts, submits them (``sbatch``), reads their states (``sacct``),
requeues a job warned before its time limit and pickles what it runs: nothing here templates or
polls SLURM by hand.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import submitit
import yaml

from fixed_embed.atomic import atomic_write_text
from fixed_embed.config import positive, read_yaml
from fixed_embed.errors import UserError

ROOT = Path(__file__).resolve().parents[2]
SLURM_DEFAULTS = ROOT / "experiments" / "slurm" / "jobs.yaml"
LIVE = (
    "PENDING",
    "RUNNING",
    "REQUEUED",
    "REQUEUE_HOLD",
    "REQUEUE_FED",
    "CONFIGURING",
    "COMPLETING",
    "SUSPENDED",
    "RESIZING",
    "SIGNALING",
    "STAGE_OUT",
    "UNKNOWN",
    "PREEMPTED",
)
# ^ states whose job may still write its row (PREEMPTED: when SLURM requeues it; submitit polls it
# on); a job's row file, once written, ends its wait whatever the state says (UNKNOWN: sacct has no
# record of it)

# this process's running fits: stopped (and saved) by stop_fits()
_fits: set[subprocess.Popen] = set()
_fits_lock = threading.Lock()
STOPPING = threading.Event()  # set by stop_fits(): this process is ending


def started(fit: subprocess.Popen) -> None:
    with _fits_lock:
        _fits.add(fit)
        if STOPPING.is_set():  # started by a job thread after stop_fits() looked: stopped too
            fit.send_signal(signal.SIGTERM)


def ended(fit: subprocess.Popen) -> None:
    with _fits_lock:
        _fits.discard(fit)


def stop_fits() -> int:
    """SIGTERM to every running fit of this process, which saves its update and exits; the
    number stopped."""
    with _fits_lock:
        STOPPING.set()
        fits = list(_fits)
    for fit in fits:
        fit.send_signal(signal.SIGTERM)
    # until it exited, without reaping it: its Popen.wait, maybe the frame this interrupted, does
    for fit in fits:
        with contextlib.suppress(ChildProcessError):
            os.waitid(os.P_PID, fit.pid, os.WEXITED | os.WNOWAIT)
    return len(fits)


@dataclass(frozen=True)
class SlurmSettings:
    """What each run's job asks SLURM for (``experiments/slurm/jobs.yaml``, then the flags)."""

    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    time_min: int = 24 * 60  # the job's time limit; a longer run is requeued and resumes
    gpus_per_run: int = 1
    cpus_per_run: int = 8
    mem_gb: int | None = None  # None: the partition's default
    # SIGUSR2 this long before the limit: the fit saves, the job is requeued
    signal_delay_s: int = 180
    max_requeues: int = 20


def _kind(name: str, flag: str) -> Any:
    """A setting's type (declared once, for the YAML and the flags): a name, or a finite number
    > 0 (>= 0)."""
    if name in ("partition", "account", "qos"):
        return str
    return positive(flag, zero=name in ("gpus_per_run", "max_requeues"))


def add_arguments(parser: argparse.ArgumentParser, jobs: int = 1) -> None:
    group = parser.add_argument_group("where the runs execute (docs/cluster.md)")
    group.add_argument(
        "--executor",
        choices=("local", "slurm"),
        default="local",
        help="local: fits on this machine (default); slurm: one SLURM job per run",
    )
    group.add_argument(
        "--jobs",
        type=positive("--jobs"),
        default=jobs,
        help="runs at once (local: fits sharing the cores; slurm: jobs queued or running)",
    )
    group.add_argument(
        "--slurm-config", type=Path, default=SLURM_DEFAULTS, help="YAML of the settings below"
    )
    for f in fields(SlurmSettings):
        flag = f"--{f.name.replace('_', '-')}"
        group.add_argument(
            flag, type=_kind(f.name, flag), help=f"slurm: {f.name} (default {f.default})"
        )
    group.add_argument(
        "--status",
        action="store_true",
        help="print each run's state (finished, running, queued, failed: job id and log) and exit",
    )


def slurm_settings(args: argparse.Namespace) -> SlurmSettings:
    """The YAML's settings, then the flags given; a key or value the YAML may not hold is
    refused naming both."""
    path, known, loaded = args.slurm_config, [f.name for f in fields(SlurmSettings)], {}
    if path.is_file():
        try:
            loaded = read_yaml(path.read_text(), str(path)) or {}
        except (UserError, yaml.YAMLError) as error:
            raise SystemExit(" ".join(str(error).split())) from None
        unknown = sorted(set(loaded) - set(known)) if isinstance(loaded, dict) else "not a mapping"
        if unknown:
            raise SystemExit(f"{path}: unknown SLURM settings {unknown}; known: {', '.join(known)}")
    try:
        values = {k: v if v is None else _kind(k, k)(str(v)) for k, v in loaded.items()}
    except UserError as error:  # the type's one-line refusal
        raise SystemExit(f"{path}: {error}") from None
    given = {name: getattr(args, name) for name in known if getattr(args, name) is not None}
    return SlurmSettings(**values | given)


class Runs:
    """A launch's jobs by key, each one's record in the file ``path`` (if given): a launch
    started again attaches to those still queued or running. Where they run: a subclass."""

    def __init__(self, jobs: int, path: Path | None) -> None:
        self.jobs, self.path, self.active = jobs, path, {}
        self.records = json.loads(path.read_text()) if path and path.is_file() else {}

    def job(self, record: dict) -> Any:
        """The job a record names, if it may outlive its launch (a local one is stopped with it)."""
        return None

    def attach(self, key: Any) -> bool:
        """Whether ``key``'s recorded job may still run (it is then active)."""
        handle = self.job(self.records.get(str(key), {}))
        if handle is not None and self.running(handle):
            self.active[key] = handle
        return key in self.active

    def submit(self, key: Any, job: Any, *args: Any, **kwargs: Any) -> None:
        self.active[key] = self.start(job, *args, **kwargs)
        self.records[str(key)] = self.record(self.active[key])
        if self.path:
            atomic_write_text(self.path, json.dumps(self.records, indent=1) + "\n")

    def ended(self, result: Callable[[Any], Any]) -> Iterator[tuple]:
        """Each job no longer active: its key, what it left (``result(key)``, falsy: nothing)
        and, where it left nothing, why it failed. A job's result ends its wait whatever its
        state."""
        for key, handle in list(self.active.items()):
            if (found := result(key)) or not self.running(handle):
                del self.active[key]
                yield key, found, None if found else self.failure(handle)


class LocalRuns(Runs):
    """``jobs`` runs at once in this process's threads, each a fit process (the cores split
    between them)."""

    name = "local"

    def __init__(self, jobs: int = 1, path: Path | None = None) -> None:
        super().__init__(jobs, path)
        self.threads = max(1, (os.cpu_count() or 1) // jobs) if jobs > 1 else None
        self._pool = ThreadPoolExecutor(max_workers=jobs)

    def start(self, job: Any, *args: Any, **kwargs: Any) -> Future:
        return self._pool.submit(job, *args, **kwargs)

    def running(self, handle: Future) -> bool:
        return not handle.done()

    def wait(self) -> None:
        """Until a job ends, or 5 s."""
        concurrent.futures.wait(self.active.values(), timeout=5.0, return_when=FIRST_COMPLETED)

    def failure(self, handle: Future) -> str:
        return f"{type(handle.exception()).__name__}: {handle.exception()}"

    def record(self, handle: Future) -> dict:
        return {"executor": "local", "pid": os.getpid()}

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True)


class SlurmRuns(Runs):
    """One SLURM job per run (submitit), its id and log recorded so that a later launch attaches
    to it."""

    name = "slurm"
    threads = None  # a job's fit has its CPUs to itself
    # how often job states are read (sacct)
    poll_s = float(os.environ.get("FIXED_EMBED_SLURM_POLL_S", 30))

    def __init__(
        self, folder: Path, settings: SlurmSettings, jobs: int = 1, path: Path | None = None
    ) -> None:
        super().__init__(jobs, path)
        self.settings, self.folder = settings, folder
        self._executor = submitit.AutoExecutor(
            folder=self.folder / "%j", cluster="slurm", slurm_max_num_timeout=settings.max_requeues
        )
        self._executor.update_parameters(  # None: not set
            timeout_min=settings.time_min,
            gpus_per_node=settings.gpus_per_run,
            cpus_per_task=settings.cpus_per_run,
            tasks_per_node=1,
            slurm_signal_delay_s=settings.signal_delay_s,
            slurm_partition=settings.partition,
            slurm_account=settings.account,
            slurm_qos=settings.qos,
            mem_gb=settings.mem_gb,
        )

    def start(self, job: Any, *args: Any, **kwargs: Any) -> Any:
        self._executor.update_parameters(name=f"fixed-embed:{args[0]}")
        return self._executor.submit(job, *args, **kwargs)

    def job(self, record: dict) -> Any:
        if record.get("executor") == "slurm":
            return submitit.SlurmJob(folder=self.folder / "%j", job_id=str(record["job"]))
        return None

    def state(self, handle: Any) -> str:
        return handle.state.split()[0].upper()  # "CANCELLED by 1234": CANCELLED

    def running(self, handle: Any) -> bool:
        return self.state(handle) in LIVE

    def wait(self) -> None:
        """``poll_s``, then every job's state read anew (one sacct), not the watcher's up to 10
        minutes old."""
        time.sleep(self.poll_s)
        submitit.SlurmJob.watcher.update()

    def failure(self, handle: Any) -> str:
        return f"SLURM job {handle.job_id} {self.state(handle)}; log {handle.paths.stderr}"

    def record(self, handle: Any) -> dict:
        return {
            "executor": "slurm",
            "job": handle.job_id,
            "log": str(handle.paths.stderr),
            "settings": asdict(self.settings),
        }

    def shutdown(self) -> None:
        return None


def executor_for(args: argparse.Namespace, folder: Path, path: Path | None) -> Runs:
    """The runs on the executor ``args`` chose, their jobs' files in ``folder``, their records
    in ``path``."""
    if args.executor == "slurm":
        return SlurmRuns(folder, slurm_settings(args), args.jobs, path)
    return LocalRuns(args.jobs, path)
