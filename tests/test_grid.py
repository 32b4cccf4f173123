"""A plan's runs as jobs (experiments/launch/grid.py, executor.py) on this machine: a launch
killed mid-grid and started again, rows merged by one process, each run's state. On SLURM:
tests/test_slurm.py."""

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
from experiments.launch.executor import LocalRuns

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


def run_all(plan, logs, out, jobs=1, **options):
    """``grid.run_all`` on this machine, ``jobs`` fits at once, its jobs recorded as a launch's."""
    runs = LocalRuns(jobs, Path(f"{out}-jobs.json"))
    return grid.run_all(plan, logs, "T", out, runs, **options)


def test_a_partial_plan_keeps_earlier_rows_and_skips_finished_runs(tmp_path, fake_fits):
    out, logs = str(tmp_path / "out"), str(tmp_path / "logs")
    runs_file.write_rows([row("a", 1.0), row("b", 2.0)], "T", out, commit="abc")
    run_all([("b", Path("c.yaml"), []), ("c", Path("c.yaml"), [])], logs, out)
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
    rows = run_all(plan, str(tmp_path / "logs"), out, jobs=2, evaluate="study", eval_device="cuda")
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
        run_all(plan, str(tmp_path / "logs"), out)
    assert list(fake_fits) == ["a"]  # c and d not started after the failure
    assert [r["name"] for r in json.loads(Path(f"{out}.json").read_text())["runs"]] == ["a"]


def test_a_finished_row_with_other_flags_is_refused_not_reused(tmp_path, monkeypatch):
    out, logs = str(tmp_path / "out"), tmp_path / "logs"
    monkeypatch.setattr(fit, "run", lambda *args, **kwargs: pytest.fail("nothing may run"))
    runs_file.write_rows([row("a", 1.0)], "T", out, commit="abc")
    with pytest.raises(
        ValueError, match=r"already has a run 'a' with flags \[\], not \['--data.train=x'\]"
    ):
        run_all([("a", Path("c.yaml"), ["--data.train=x"])], str(logs), out)
    (logs / "b").mkdir(parents=True)  # a job's row file of other flags too
    (logs / "b" / grid.ROW).write_text(json.dumps(row("b", 1.0, ["--x=1"])))
    with pytest.raises(
        ValueError, match=r"row.json already has a run 'b' with flags \['--x=1'\], not \[\]"
    ):
        run_all([("b", Path("c.yaml"), [])], str(logs), str(tmp_path / "other"))


def test_a_row_a_job_wrote_while_no_launch_merged_it_is_merged_not_rerun(tmp_path, monkeypatch):
    out, logs = str(tmp_path / "out"), tmp_path / "logs"
    monkeypatch.setattr(fit, "run", lambda *args, **kwargs: pytest.fail("nothing may run"))
    monkeypatch.setattr(fit, "git_commit", lambda: "abc")
    (logs / "a").mkdir(parents=True)
    (logs / "a" / grid.ROW).write_text(json.dumps(row("a", 1.5)))
    assert run_all([("a", Path("c.yaml"), [])], str(logs), out)[0]["val_loss"] == 1.5
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


def lines_with(path: Path, text: str) -> list[str]:
    return (
        [line for line in path.read_text(errors="replace").splitlines() if text in line]
        if path.is_file()
        else []
    )


def wait_until(condition, what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def updates_of(run_dir: Path) -> list[int]:
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
        "experiments.launch.grid as g; from experiments.launch.executor import LocalRuns; "
        f"g.run_all([(n, Path(c), e) for n, c, e in {plan!r}], {str(logs)!r}, 'T', {str(out)!r}, "
        f"LocalRuns(2, Path({str(out)!r} + '-jobs.json')))"
    )
    launch = [sys.executable, "-c", script]
    first = subprocess.Popen(
        launch, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    consoles = [logs / name / "default" / "console.log" for name in ("a", "b")]
    wait_until(
        lambda: (
            all(lines_with(c, "validation at update 40") for c in consoles)
            or first.poll() is not None
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
        resumed = lines_with(run_dir / "console.log", "resuming ")
        assert len(resumed) == 1 and updates_of(run_dir) == list(range(120)), resumed
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
    # the end of the run's in-loop benchmark and the job's
    assert sum(step == 119 for step, _ in bench) == 2, bench
    again = subprocess.run(score, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    # what is scored is not scored twice
    assert again.returncode == 0 and "scoring " not in again.stdout
