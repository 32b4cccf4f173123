"""Runs as SLURM jobs (experiments/launch/executor.py, experiments/slurm/): the settings the jobs
ask for, and on stand-ins for SLURM's commands (tests/slurm_stand_in.py) a warned job requeued, a
relaunch attached to it, and fit.sbatch requeuing itself."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from experiments.launch.executor import SlurmSettings, add_arguments, slurm_settings
from tests.test_grid import FAST, ROOT, TINY, lines_with, updates_of, wait_until


def _settings(tmp_path, yaml_text: str | None, *flags: str) -> SlurmSettings:
    import argparse

    parser = argparse.ArgumentParser(exit_on_error=False)
    add_arguments(parser)
    config = tmp_path / ("slurm.yaml" if yaml_text is not None else "absent.yaml")
    if yaml_text is not None:
        config.write_text(yaml_text)
    return slurm_settings(parser.parse_args(["--slurm-config", str(config), *flags]))


def test_slurm_settings_come_from_the_yaml_then_the_flags(tmp_path):
    settings = _settings(
        tmp_path, "partition: gpu\ntime_min: 600\ngpus_per_run: 2\n", "--time-min", "90"
    )
    assert (
        settings.partition,
        settings.time_min,
        settings.gpus_per_run,
        settings.cpus_per_run,
    ) == ("gpu", 90, 2, 8)
    assert _settings(tmp_path, None) == SlurmSettings()
    # experiments/slurm/jobs.yaml, the default file, is valid
    assert (
        _settings(tmp_path, (ROOT / "experiments" / "slurm" / "jobs.yaml").read_text()).time_min > 0
    )


@pytest.mark.parametrize(
    "key",
    [
        "time_min",
        "gpus_per_run",
        "cpus_per_run",
        "mem_gb",
        "signal_delay_s",
        "max_requeues",
        "partitoin",
    ],
)
@pytest.mark.parametrize("value", ["-1", "0", "nan", "inf", "two"])
def test_a_bad_slurm_setting_is_refused_in_one_line_naming_the_file_and_key(tmp_path, key, value):
    zero_ok = key in ("gpus_per_run", "max_requeues")
    if value == "0" and zero_ok:
        assert getattr(_settings(tmp_path, f"{key}: 0\n"), key) == 0
        return
    with pytest.raises(SystemExit) as refused:
        _settings(tmp_path, f"{key}: {value}\n")
    message = str(refused.value)
    assert (
        message.startswith(f"{tmp_path / 'slurm.yaml'}: ")
        and key in message
        and "\n" not in message
    )


def _saved_on_stop(console: Path) -> list[str]:
    """The fit's line for its stop: the preemption's, or the in-loop benchmark's when the signal
    came during it."""
    return lines_with(console, "SIGTERM -> saved") or lines_with(
        console, "stopped by a stop request (the checkpoint is saved)"
    )


@pytest.fixture
def slurm(tmp_path, monkeypatch):
    """sbatch, srun, sacct, scancel, scontrol and squeue stand-ins first on PATH; their state
    folder."""
    bin_dir, state = tmp_path / "slurm-bin", tmp_path / "slurm-state"
    bin_dir.mkdir()
    subprocess.run(
        [sys.executable, str(ROOT / "tests" / "slurm_stand_in.py"), "install", str(bin_dir)],
        check=True,
    )
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SLURM_DIR", str(state))
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.setenv("FIXED_EMBED_SLURM_POLL_S", "0.5")
    return state


@pytest.mark.slow
def test_slurm_jobs_carry_their_settings_a_warned_job_is_requeued_and_a_relaunch_attaches(
    tmp_path, slurm
):
    """`controls.py --executor slurm`: one job per run with the settings asked. The launch is
    killed (SIGKILL) while the job trains; SIGUSR2 before the time limit: the fit saves,
    submitit requeues the job, which resumes it; the same command, started again, attaches to
    the requeued job and merges its row."""
    logs, out = tmp_path / "logs", tmp_path / "out"
    launch = [
        sys.executable,
        str(ROOT / "experiments" / "controls.py"),
        "--only",
        "tiny/learned",
        "--executor",
        "slurm",
        "--partition",
        "gpu",
        "--account",
        "lab",
        "--time-min",
        "90",
        "--gpus-per-run",
        "0",
        "--cpus-per-run",
        "2",
        "--signal-delay-s",
        "60",
        "--logs",
        str(logs),
        "--out",
        str(out),
        "--",
        *FAST,
    ]
    first = subprocess.Popen(
        launch, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    run_dir = logs / "tiny" / "learned" / "default"
    wait_until(
        lambda: (
            lines_with(run_dir / "console.log", "validation at update 40")
            or first.poll() is not None
        ),
        "the job's fit to validate once",
        timeout=180,
    )
    first.kill()  # the launch dies; its job lives on
    first.wait()
    job = json.loads(Path(f"{out}-jobs.json").read_text())["tiny/learned"]
    script = next((logs / "jobs").rglob("*_submission.sh")).read_text()
    for option in (
        "--partition=gpu",
        "--account=lab",
        "--time=90",
        "--cpus-per-task=2",
        "--signal=USR2@60",
    ):
        assert f"#SBATCH {option}" in script, script
    # SLURM's warning before the limit
    subprocess.run(["scancel", "--signal", "USR2", job["job"]], check=True)
    wait_until(
        lambda: json.loads((slurm / f"{job['job']}.json").read_text())["restarts"] == 1,
        "the requeue",
    )
    again = subprocess.run(launch, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert f"attached to slurm job {job['job']}" in again.stdout
    # not resubmitted
    assert json.loads(Path(f"{out}-jobs.json").read_text())["tiny/learned"]["job"] == job["job"]
    assert [r["name"] for r in json.loads(out.with_suffix(".json").read_text())["runs"]] == [
        "tiny/learned"
    ]
    console = run_dir / "console.log"
    assert len(_saved_on_stop(console)) == 1 and len(lines_with(console, "resuming ")) == 1
    assert updates_of(run_dir) == list(range(120))


@pytest.mark.slow
def test_the_fit_sbatch_file_requeues_itself_before_its_time_limit_and_resumes(tmp_path, slurm):
    """experiments/slurm/fit.sbatch: USR1 to its shell (--signal=B:USR1@300): the ranks save,
    the job is requeued and the same script resumes the fit to its end."""
    logs = tmp_path / "logs"
    fit = str(Path(sys.executable).parent / "fixed-embed")
    submit = subprocess.run(
        [
            "sbatch",
            str(ROOT / "experiments" / "slurm" / "fit.sbatch"),
            "--config",
            str(TINY / "learned.yaml"),
            f"--trainer.logger.init_args.save_dir={logs}",
            *FAST,
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "FIXED_EMBED": fit},
    )
    job = submit.stdout.split()[-1]
    state = slurm / f"{job}.json"
    run_dir = logs / "tiny" / "learned" / "default"
    wait_until(
        lambda: (
            lines_with(run_dir / "console.log", "validation at update 40")
            or json.loads(state.read_text())["state"] not in ("PENDING", "RUNNING")
        ),
        "the fit to validate once",
    )
    subprocess.run(["scancel", "--batch", "--signal", "USR1", job], check=True)
    wait_until(
        lambda: json.loads(state.read_text())["state"] in ("COMPLETED", "FAILED"),
        "the job's end",
        timeout=180,
    )
    ended = json.loads(state.read_text())
    assert (ended["state"], ended["restarts"]) == ("COMPLETED", 1)
    console = run_dir / "console.log"
    assert len(_saved_on_stop(console)) == 1 and len(lines_with(console, "resuming ")) == 1
    assert updates_of(run_dir) == list(range(120))
