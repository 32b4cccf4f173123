"""The experiment runner's result files: resumable JSON, a Markdown table, and the seed summary."""

import json
from pathlib import Path

import pytest

import experiments.runs as runs


def row(name, loss):
    return {"name": name, "trainable_params": 10, "val_loss": loss, "val_ppl": 2.718**loss, "tokens_per_sec": 1.0,
            "wall_seconds": 60.0, "config": "c.yaml", "extra": [], "logs": "logs"}  # fmt: skip


def test_seed_groups_and_summary_table(tmp_path):
    rows = [row("tiny/gf2", 6.0), row("tiny/gf2-seed2", 6.2), row("tiny/gf2-seed3", 6.1), row("beyond/x", 5.0)]
    assert runs.seed_groups(rows) == {"tiny/gf2": [6.0, 6.2, 6.1], "beyond/x": [5.0]}
    runs.write_rows(rows, "T", str(tmp_path / "out"), commit="abc")
    table = (tmp_path / "out.md").read_text()
    assert "| tiny/gf2 | 3 | 6.100 | 0.100 | 6.000 | 6.200 |" in table and "commit `abc`" in table
    assert json.loads((tmp_path / "out.json").read_text())["runs"] == rows


def test_a_partial_plan_keeps_earlier_rows_and_skips_finished_runs(tmp_path, monkeypatch):
    out = str(tmp_path / "out")
    runs.write_rows([row("a", 1.0), row("b", 2.0)], "T", out, commit="abc")
    ran = []
    monkeypatch.setattr(runs, "run", lambda name, *args, **kwargs: ran.append(name) or row(name, 3.0))
    monkeypatch.setattr(runs, "_git_commit", lambda: "def")
    runs.run_all([("b", Path("c.yaml"), []), ("c", Path("c.yaml"), [])], "logs", "T", out)
    assert ran == ["c"]  # b was finished
    assert [r["name"] for r in json.loads(Path(f"{out}.json").read_text())["runs"]] == ["a", "b", "c"]
    with pytest.raises(KeyError):
        runs.seed_groups([{"name": "x"}])


def test_parallel_jobs_keep_the_plan_order_and_split_the_cores(tmp_path, monkeypatch):
    import threading
    import time

    out, seen = str(tmp_path / "out"), {}
    barrier = threading.Barrier(2, timeout=10)

    def fake(name, config, logs, extra, threads=None, evaluate=None, eval_device="cpu"):
        if name in ("a", "b"):
            barrier.wait()  # both started before either finished: two at once
        time.sleep(0.05 if name == "a" else 0)
        seen[name] = (threads, evaluate, eval_device)
        return row(name, 1.0)

    monkeypatch.setattr(runs, "run", fake)
    monkeypatch.setattr(runs.os, "cpu_count", lambda: 4)
    monkeypatch.setattr(runs, "_git_commit", lambda: "abc")
    plan = [(n, Path("c.yaml"), []) for n in ("a", "b", "c")]
    rows = runs.run_all(plan, "logs", "T", out, jobs=2, evaluate="study", eval_device="cuda")
    assert [r["name"] for r in rows] == ["a", "b", "c"]
    assert [r["name"] for r in json.loads(Path(f"{out}.json").read_text())["runs"]] == ["a", "b", "c"]
    assert seen == {n: (2, "study", "cuda") for n in "abc"}


def test_a_failed_run_stops_the_sweep_and_keeps_finished_rows(tmp_path, monkeypatch):
    out, ran = str(tmp_path / "out"), []

    def fake(name, *args, **kwargs):
        ran.append(name)
        if name == "b":
            raise RuntimeError("fit failed")
        return row(name, 1.0)

    monkeypatch.setattr(runs, "run", fake)
    monkeypatch.setattr(runs, "_git_commit", lambda: "abc")
    plan = [(n, Path("c.yaml"), []) for n in ("a", "b", "c", "d")]
    with pytest.raises(RuntimeError, match="fit failed"):
        runs.run_all(plan, "logs", "T", out, jobs=1)
    assert ran == ["a", "b"]
    assert [r["name"] for r in json.loads(Path(f"{out}.json").read_text())["runs"]] == ["a"]


def test_a_finished_row_with_other_flags_is_refused_not_reused(tmp_path, monkeypatch):
    out = str(tmp_path / "out")
    runs.write_rows([row("a", 1.0)], "T", out, commit="abc")
    monkeypatch.setattr(runs, "run", lambda *args, **kwargs: pytest.fail("nothing may run"))
    with pytest.raises(ValueError, match=r"already has a run 'a' with flags \[\], not \['--data.train=x'\]"):
        runs.run_all([("a", Path("c.yaml"), ["--data.train=x"])], "logs", "T", out)


def test_a_resumed_run_says_so_and_records_the_commit_it_started_from(tmp_path, monkeypatch):
    logs, name = tmp_path / "logs", "tiny/binary16"
    run_dir = logs / name / "default"
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "checkpoints" / "step=00000100.ckpt").write_bytes(b"")  # an earlier attempt's checkpoint (no last link)
    commits = iter(["at-start", "at-end"])
    monkeypatch.setattr(runs, "_git_commit", lambda: next(commits))
    monkeypatch.setattr(runs, "_code_changed", lambda: True)
    monkeypatch.setattr(runs.subprocess, "run", lambda *a, **k: None)  # the fit itself
    monkeypatch.setattr(runs, "curves", lambda d: {"val/loss": [[9, 2.0]]})
    monkeypatch.setattr(runs, "tokens_seen", lambda d: 1000)
    result = runs.run(name, runs.ROOT / "experiments" / "tiny" / "binary16.yaml", str(logs), [])
    assert (result["commit"], result["code_changed"], result["resumed"]) == ("at-start", True, True)
    assert result["tokens_per_sec"] is None  # the wall time covers the last attempt only
    runs.write_rows([result], "T", str(tmp_path / "out"), commit="abc")
    assert "| resumed | " in (tmp_path / "out.md").read_text() and "(last attempt)" in (tmp_path / "out.md").read_text()


def test_a_resumed_row_shows_no_rate_even_where_it_carries_one(tmp_path):
    # total tokens over the last attempt's wall time: neither the run's rate nor the last attempt's
    stale = {**row("m/lowrank", 5.33), "resumed": True, "tokens_per_sec": 3373.0, "wall_seconds": 262.3}
    runs.write_rows([stale, row("m/learned", 5.18)], "T", str(tmp_path / "out"), commit="abc")
    table = (tmp_path / "out.md").read_text()
    assert "| m/lowrank | 10 | 5.330 | 206.3 | resumed | 4.4 (last attempt) |" in table and "3,373" not in table
    assert "| m/learned | 10 | 5.180 | 177.6 | 1 | 1.0 |" in table


def test_a_runs_file_changed_in_place_is_refused_in_one_line_naming_it(tmp_path):
    from tests.test_corrupt_contents import flip

    out = str(tmp_path / "out")
    runs.write_rows([row("a", 1.0), row("b", 2.0)], "T", out, commit="abc")
    flip(Path(f"{out}.json"))  # the same size, other bytes: a study must not resume from or render it
    with pytest.raises(SystemExit, match=rf"^cannot read the runs file {out}\.json \(\w+: [^\n]*\): restore it"):
        runs.read_runs(f"{out}.json")


def test_a_second_writer_of_a_runs_file_is_refused_naming_the_holder(tmp_path):
    """A second study (controls, recodings) on one --out would train and write the same rows."""
    import os

    path = str(tmp_path / "out.json")
    first = runs.hold(path)
    runs.hold.cache_clear()  # as another process would: it does not hold the lock yet
    with pytest.raises(SystemExit, match=rf"is in use by another launch \(pid {os.getpid()} .* or pass another --out"):
        runs.hold(path)
    first.release()
    assert not list(tmp_path.iterdir())  # released: the lock file gone, nothing stray
