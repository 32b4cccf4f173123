"""A plan's runs as jobs (experiments/launch/grid.py, executor.py): locally and on SLURM
stand-ins, a launch killed mid-grid and started again, rows merged by one process, the settings
the jobs ask for."""

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import experiments.launch.grid as grid
from experiments.launch import fit, runs_file
from experiments.launch.executor import LocalRuns, SlurmSettings, add_arguments, slurm_settings

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "experiments" / "tiny"
# a 1-layer d-32 model on the tiny setup: 120 updates in a few seconds, validated every 40
FAST = [
    "--model.decoder.d_model=32",
    "--model.decoder.n_layers=1",
    "--model.decoder.n_heads=4",
    "--model.decoder.ffn_dim=64",
    "--model.decoder.max_seq_len=64",
    "--data.seq_len=64",
    "--data.batch_size=2",
    "--data.val_sequences=4",
    "--trainer.max_steps=120",
    "--trainer.val_check_interval=40",
    "--trainer.log_every_n_steps=1",
]


def row(name, loss, extra=()):
    return {
        "name": name,
        "trainable_params": 10,
        "val_loss": loss,
        "val_ppl": 2.718**loss,
        "tokens_per_sec": 1.0,
        "wall_seconds": 60.0,
        "config": "c.yaml",
        "extra": list(extra),
        "logs": "logs",
    }


@pytest.fixture
def fake_fits(monkeypatch):
    """``fit.run`` replaced: each call recorded (name -> threads, evaluate, eval_device), its
    row returned."""
    seen = {}

    def fake(name, config, logs, extra, threads=None, evaluate=None, eval_device="cpu"):
        seen[name] = (threads, evaluate, eval_device)
        return row(name, 1.0, extra)

    monkeypatch.setattr(fit, "run", fake)
    monkeypatch.setattr(fit, "git_commit", lambda: "abc")
    return seen


def test_a_partial_plan_keeps_earlier_rows_and_skips_finished_runs(tmp_path, fake_fits):
    out, logs = str(tmp_path / "out"), str(tmp_path / "logs")
    runs_file.write_rows([row("a", 1.0), row("b", 2.0)], "T", out, commit="abc")
    grid.run_all([("b", Path("c.yaml"), []), ("c", Path("c.yaml"), [])], logs, "T", out)
    assert list(fake_fits) == ["c"]  # b was finished
    assert [r["name"] for r in json.loads(Path(f"{out}.json").read_text())["runs"]] == [
        "a",
        "b",
        "c",
    ]
    assert json.loads(Path(f"{out}-jobs.json").read_text())["c"]["executor"] == "local"


def test_parallel_jobs_keep_the_plan_order_and_split_the_cores(tmp_path, monkeypatch, fake_fits):
    barrier, fake = threading.Barrier(2, timeout=10), fit.run

    def both_at_once(name, *args, **kwargs):
        if name in ("a", "b"):
            barrier.wait()  # both started before either finished: two at once
        time.sleep(0.05 if name == "a" else 0)
        return fake(name, *args, **kwargs)

    monkeypatch.setattr(fit, "run", both_at_once)
    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    out = str(tmp_path / "out")
    plan = [(n, Path("c.yaml"), []) for n in ("a", "b", "c")]
    rows = grid.run_all(
        plan, str(tmp_path / "logs"), "T", out, jobs=2, evaluate="study", eval_device="cuda"
    )
    assert [r["name"] for r in rows] == ["a", "b", "c"]
    assert [r["name"] for r in json.loads(Path(f"{out}.json").read_text())["runs"]] == [
        "a",
        "b",
        "c",
    ]
    assert fake_fits == {n: (2, "study", "cuda") for n in "abc"}


def test_a_failed_run_is_reported_once_and_stops_new_ones_keeping_finished_rows(
    tmp_path, monkeypatch, fake_fits
):
    fake = fit.run

    def fails_on_b(name, *args, **kwargs):
        if name == "b":
            raise RuntimeError("fit exited with status 2; its log: logs/b/default/console.log")
        return fake(name, *args, **kwargs)

    monkeypatch.setattr(fit, "run", fails_on_b)
    out = str(tmp_path / "out")
    plan = [(n, Path("c.yaml"), []) for n in ("a", "b", "c", "d")]
    with pytest.raises(
        SystemExit, match=r"1 runs failed .*\n  b: RuntimeError: fit exited with status 2; its log"
    ):
        grid.run_all(plan, str(tmp_path / "logs"), "T", out, jobs=1)
    assert list(fake_fits) == ["a"]  # c and d not started after the failure
    assert [r["name"] for r in json.loads(Path(f"{out}.json").read_text())["runs"]] == ["a"]


def test_a_finished_row_with_other_flags_is_refused_not_reused(tmp_path, monkeypatch):
    out, logs = str(tmp_path / "out"), tmp_path / "logs"
    monkeypatch.setattr(fit, "run", lambda *args, **kwargs: pytest.fail("nothing may run"))
    runs_file.write_rows([row("a", 1.0)], "T", out, commit="abc")
    with pytest.raises(
        ValueError, match=r"already has a run 'a' with flags \[\], not \['--data.train=x'\]"
    ):
        grid.run_all([("a", Path("c.yaml"), ["--data.train=x"])], str(logs), "T", out)
    (logs / "b").mkdir(parents=True)  # a job's row file of other flags too
    (logs / "b" / grid.ROW).write_text(json.dumps(row("b", 1.0, ["--x=1"])))
    with pytest.raises(
        ValueError, match=r"row.json already has a run 'b' with flags \['--x=1'\], not \[\]"
    ):
        grid.run_all([("b", Path("c.yaml"), [])], str(logs), "T", str(tmp_path / "other"))


def test_a_row_a_job_wrote_while_no_launch_merged_it_is_merged_not_rerun(tmp_path, monkeypatch):
    out, logs = str(tmp_path / "out"), tmp_path / "logs"
    monkeypatch.setattr(fit, "run", lambda *args, **kwargs: pytest.fail("nothing may run"))
    monkeypatch.setattr(fit, "git_commit", lambda: "abc")
    (logs / "a").mkdir(parents=True)
    (logs / "a" / grid.ROW).write_text(json.dumps(row("a", 1.5)))
    assert grid.run_all([("a", Path("c.yaml"), [])], str(logs), "T", out)[0]["val_loss"] == 1.5
    assert json.loads(Path(f"{out}.json").read_text())["runs"][0]["val_loss"] == 1.5


def test_status_names_each_runs_state(tmp_path, monkeypatch):
    out, logs = str(tmp_path / "out"), tmp_path / "logs"
    runs_file.write_rows([row("a", 1.0)], "T", out, commit="abc")
    (logs / "b").mkdir(parents=True)
    (logs / "b" / grid.ROW).write_text(json.dumps(row("b", 1.0)))
    (logs / "c" / "default" / "checkpoints").mkdir(parents=True)
    (logs / "d" / "default").mkdir(parents=True)
    (logs / "d" / "default" / "run.lock").write_text('{"pid": 42, "host": "node7"}')
    plan = [(n, Path("c.yaml"), []) for n in "abcde"]
    lines = grid.status(plan, str(logs), out, LocalRuns())
    states = {line.split()[0]: line.split(maxsplit=1)[1] for line in lines[:-1]}
    assert states["a"] == "finished" and states["b"] == "finished (row not merged yet)"
    assert states["c"].startswith("stopped, resumes from") and states["d"].startswith(
        'running ({"pid": 42'
    )
    assert states["e"] == "not started"
    assert lines[-1] == "2 finished, 1 stopped, 1 running, 1 not started of 5 runs"


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


def test_the_wall_time_of_a_plan_waits_for_each_stage_and_fills_the_slots(monkeypatch):
    import experiments.plan.estimate as estimate

    hours = {"a": 4.0, "b": 3.0, "c": 2.0, "d": 1.0, "e": 5.0}
    monkeypatch.setattr(
        estimate, "run_compute", lambda configs, flags: (0, hours[configs] * 3600.0)
    )
    stages = [[(n, n, []) for n in "abcd"], [("e", "e", [])]]
    assert estimate.wall_hours(stages, 1.0, 1) == 15.0  # one at a time: the sum
    assert estimate.wall_hours(stages, 1.0, 2) == 5.0 + 5.0  # {a, d} and {b, c}, then e
    assert estimate.wall_hours(stages, 1.0, 8) == 4.0 + 5.0  # the longest of each stage
    assert estimate.wall_hours(stages, 1.0, 2, skip={"a"}) == 3.0 + 5.0


def _lines(path: Path, text: str) -> list[str]:
    return (
        [line for line in path.read_text(errors="replace").splitlines() if text in line]
        if path.is_file()
        else []
    )


def _wait_for(condition, what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def _saved_on_stop(console: Path) -> list[str]:
    """The fit's line for its stop: the preemption's, or the in-loop benchmark's when the signal
    came during it."""
    return _lines(console, "SIGTERM -> saved") or _lines(
        console, "stopped by a stop request (the checkpoint is saved)"
    )


def _updates(run_dir: Path) -> list[int]:
    return [step for step, _ in fit.curves(run_dir, ("train/loss",))["train/loss"]]


@pytest.mark.slow
def test_a_local_grid_killed_mid_way_continues_every_run_exactly_once(tmp_path):
    """Two fits at once; SIGTERM to the launch while both train: each saves, and the same
    command resumes them. A third run, the first's twin under another name, trains
    uninterrupted: the resumed run's row equals it."""
    logs, out = tmp_path / "logs", tmp_path / "out"
    plan = [
        (name, str(TINY / f"{variant}.yaml"), FAST)
        for name, variant in (("a", "learned"), ("b", "binary16"), ("twin", "learned"))
    ]
    script = (
        f"import sys; sys.path.insert(0, {str(ROOT)!r}); from pathlib import Path; import "
        "experiments.launch.grid as g; "
        f"g.run_all([(n, Path(c), e) for n, c, e in {plan!r}], {str(logs)!r}, 'T', {str(out)!r}, "
        "jobs=2)"
    )
    launch = [sys.executable, "-c", script]
    first = subprocess.Popen(
        launch, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    consoles = [logs / name / "default" / "console.log" for name in ("a", "b")]
    _wait_for(
        lambda: (
            all(_lines(c, "validation at update 40") for c in consoles) or first.poll() is not None
        ),
        "both fits to validate once",
    )
    first.send_signal(signal.SIGTERM)
    said = first.communicate(timeout=120)[0]
    assert (
        first.returncode == 1
        and "T: stopped (SIGTERM); 2 running fits saved their checkpoints" in said
    ), said
    assert not out.with_suffix(".json").exists()  # no run had finished
    again = subprocess.run(launch, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    rows = {r["name"]: r for r in json.loads(out.with_suffix(".json").read_text())["runs"]}
    assert list(rows) == ["a", "b", "twin"] and rows["a"]["resumed"] and not rows["twin"]["resumed"]
    for name in ("a", "b"):  # each resumed where SIGTERM saved it, no update trained twice
        run_dir = logs / name / "default"
        resumed = _lines(run_dir / "console.log", "resuming ")
        assert len(resumed) == 1 and _updates(run_dir) == list(range(120)), resumed
    assert rows["a"]["val_loss"] == rows["twin"]["val_loss"]
    assert rows["a"]["curves"]["train/loss"] == rows["twin"]["curves"]["train/loss"]
    # its checkpoints scored in jobs of their own, as on the training ranks: the same folder and
    # scalars
    run_dir = logs / "b" / "default"
    in_loop = json.loads((run_dir / "benchmarks" / "step_00000120" / "results.json").read_text())[
        "scores"
    ]
    shutil.rmtree(run_dir / "benchmarks")
    score = [
        sys.executable,
        str(ROOT / "experiments" / "evaluate.py"),
        str(run_dir),
        "--jobs",
        "2",
        "--device",
        "cpu",
    ]
    scored = subprocess.run(score, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert scored.returncode == 0 and scored.stdout.count("scoring ") == 2, (
        scored.stdout + scored.stderr[-3000:]
    )
    assert (
        json.loads((run_dir / "benchmarks" / "step_00000120" / "results.json").read_text())[
            "scores"
        ]
        == in_loop
    )
    bench = fit.curves(run_dir, ("bench/fixed_embed_word_order/acc",))[
        "bench/fixed_embed_word_order/acc"
    ]
    scores: dict[
        int, set
    ] = {}  # the in-loop benchmark's and the jobs' at each update: the same scores
    for step, value in bench:
        scores.setdefault(step, set()).add(value)
    # (the in-loop one at update 100 is missing when the SIGTERM stopped it mid-way: the job's then
    # stands alone)
    assert sorted(scores) == [99, 119] and all(len(same) == 1 for same in scores.values()), bench
    assert sum(step == 119 for step, _ in bench) == 2, (
        bench
    )  # the end of the run's in-loop benchmark and the job's
    again = subprocess.run(score, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert (
        again.returncode == 0 and "scoring " not in again.stdout
    )  # what is scored is not scored twice


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
    _wait_for(
        lambda: (
            _lines(run_dir / "console.log", "validation at update 40") or first.poll() is not None
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
    subprocess.run(
        ["scancel", "--signal", "USR2", job["job"]], check=True
    )  # SLURM's warning before the limit
    _wait_for(
        lambda: json.loads((slurm / f"{job['job']}.json").read_text())["restarts"] == 1,
        "the requeue",
    )
    again = subprocess.run(launch, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert f"attached to slurm job {job['job']}" in again.stdout
    assert (
        json.loads(Path(f"{out}-jobs.json").read_text())["tiny/learned"]["job"] == job["job"]
    )  # not resubmitted
    assert [r["name"] for r in json.loads(out.with_suffix(".json").read_text())["runs"]] == [
        "tiny/learned"
    ]
    console = run_dir / "console.log"
    assert len(_saved_on_stop(console)) == 1 and len(_lines(console, "resuming ")) == 1
    assert _updates(run_dir) == list(range(120))


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
    _wait_for(
        lambda: (
            _lines(run_dir / "console.log", "validation at update 40")
            or json.loads(state.read_text())["state"] not in ("PENDING", "RUNNING")
        ),
        "the fit to validate once",
    )
    subprocess.run(["scancel", "--batch", "--signal", "USR1", job], check=True)
    _wait_for(
        lambda: json.loads(state.read_text())["state"] in ("COMPLETED", "FAILED"),
        "the job's end",
        timeout=180,
    )
    ended = json.loads(state.read_text())
    assert (ended["state"], ended["restarts"]) == ("COMPLETED", 1)
    console = run_dir / "console.log"
    assert len(_saved_on_stop(console)) == 1 and len(_lines(console, "resuming ")) == 1
    assert _updates(run_dir) == list(range(120))
