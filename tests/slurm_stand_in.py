"""Stand-ins for SLURM's sbatch, srun, sacct, scancel, scontrol and squeue on one machine, for
the tests of ``--executor slurm`` (tests/test_slurm.py). Each job runs its script in a session of
its own; its state, its process group and its requeues live in ``$FAKE_SLURM_DIR``. ``python
slurm_stand_in.py install BIN`` writes the commands into BIN."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

COMMANDS = ("sbatch", "srun", "sacct", "scancel", "scontrol", "squeue")
STATE = Path(os.environ.get("FAKE_SLURM_DIR", "/nonexistent"))


def _job(job_id: str) -> dict:
    return json.loads((STATE / f"{job_id}.json").read_text())


def _save(job: dict) -> None:
    tmp = STATE / f"{job['id']}.json.tmp-{os.getpid()}"
    tmp.write_text(json.dumps(job))
    tmp.replace(STATE / f"{job['id']}.json")


def sbatch(argv: list[str]) -> None:
    # options, the script, its arguments
    at = next(i for i, arg in enumerate(argv) if not arg.startswith("-"))
    script, args = Path(argv[at]), argv[at + 1 :]
    STATE.mkdir(parents=True, exist_ok=True)
    job_id = str(len(list(STATE.glob("*.json"))) + 1001)
    _save(
        {
            "id": job_id,
            "script": str(script),
            "args": args,
            "cwd": os.getcwd(),
            "state": "PENDING",
            "pgid": None,
            "restarts": 0,
            "requeue": False,
        }
    )
    subprocess.Popen(
        [sys.executable, __file__, "_run", job_id],
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    print(f"Submitted batch job {job_id}")


def _run(job_id: str) -> None:
    """The job's life: its script, then again while it is requeued."""
    while True:
        job = _job(job_id)
        env = {
            **os.environ,
            "SLURM_JOB_ID": job_id,
            "SLURM_JOB_NAME": "stand-in",
            "SLURM_NTASKS": "1",
            "SLURM_JOB_NUM_NODES": "1",
            "SLURM_JOB_NODELIST": "localhost",
            "SLURM_RESTART_COUNT": str(job["restarts"]),
        }
        env["SLURM_SUBMIT_DIR"] = job["cwd"]
        (STATE / f"{job_id}.step").unlink(missing_ok=True)  # the last attempt's step
        proc = subprocess.Popen(
            ["bash", job["script"], *job["args"]], env=env, cwd=job["cwd"], start_new_session=True
        )
        _save({**job, "state": "RUNNING", "pgid": proc.pid, "requeue": False})
        code = proc.wait()
        job = _job(job_id)
        if job["requeue"]:
            _save({**job, "restarts": job["restarts"] + 1, "state": "PENDING"})
            continue
        if job["state"] != "CANCELLED":
            _save({**job, "state": "COMPLETED" if code == 0 else "FAILED"})
        return


def srun(argv: list[str]) -> None:
    """``srun [--unbuffered] --output O [--error E] CMD...``: the task in a process group of its
    own (the step: what ``scancel --signal`` reaches), its output appended to O (and E). As the
    real srun, a SIGTERM to srun itself ends the task with SIGKILL (srun: forcing job
    termination)."""
    job_id, files, i = os.environ["SLURM_JOB_ID"], {}, 0
    while argv[i].startswith("--"):
        if argv[i] in ("--output", "--error"):
            files[argv[i]] = argv[i + 1].replace("%j", job_id).replace("%t", "0")
            i += 2
        else:
            i += 1
    out = open(files["--output"], "ab") if "--output" in files else None  # noqa: SIM115
    err = open(files.get("--error", files["--output"]), "ab") if "--output" in files else None  # noqa: SIM115
    env = {**os.environ, "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0"}
    task = subprocess.Popen(argv[i:], env=env, stdout=out, stderr=err, process_group=0)
    (STATE / f"{job_id}.step").write_text(str(task.pid))
    signal.signal(signal.SIGTERM, lambda signum, frame: task.kill())
    sys.exit(task.wait())


def sacct(argv: list[str]) -> None:
    ids = argv[argv.index("-j") + 1].split(",")
    print("JobID|State|NodeList")
    for job_id in ids:
        if (STATE / f"{job_id}.json").is_file():
            print(f"{job_id}|{_job(job_id)['state']}|localhost")


def _signal(job_id: str, signum: int, groups: tuple[str, ...] = ("step", "pgid")) -> None:
    step = STATE / f"{job_id}.step"
    found = {
        "pgid": _job(job_id)["pgid"],
        "step": int(step.read_text()) if step.is_file() else None,
    }
    for group in groups:
        if found[group]:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(found[group], signum)


def scancel(argv: list[str]) -> None:
    job_id = argv[-1]
    at = next((i for i, arg in enumerate(argv) if arg.startswith("--signal")), None)
    if at is not None:  # --signal SIG or --signal=SIG
        name = argv[at].partition("=")[2] or argv[at + 1]
        signum = getattr(signal, "SIG" + name.removeprefix("SIG"))
        # the batch shell, or the step
        _signal(job_id, signum, ("pgid",) if "--batch" in argv else ("step",))
        return
    _save({**_job(job_id), "state": "CANCELLED"})
    _signal(job_id, signal.SIGTERM)


def scontrol(argv: list[str]) -> None:
    if argv[:1] == ["requeue"]:
        job_id = argv[1]
        _save({**_job(job_id), "requeue": True})
        time.sleep(0.2)
        _signal(job_id, signal.SIGKILL)


def squeue(argv: list[str]) -> None:
    for path in sorted(STATE.glob("*.json")):
        job = json.loads(path.read_text())
        print(f"{job['id']} {job['state']}")


def install(folder: str) -> None:
    for command in COMMANDS:
        path = Path(folder) / command
        path.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{__file__}" {command} "$@"\n')
        path.chmod(0o755)


if __name__ == "__main__":
    commands = {name: globals()[name] for name in (*COMMANDS, "install")}
    if sys.argv[1] == "_run":
        _run(sys.argv[2])
    elif sys.argv[1] == "install":
        install(sys.argv[2])
    else:
        commands[sys.argv[1]](sys.argv[2:])
