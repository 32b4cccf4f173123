"""The experiment runner's result files: resumable JSON, a Markdown table, and the seed summary."""

import json
from pathlib import Path

import pytest

from experiments.launch import fit, runs_file
from experiments.launch.record import resolve


def row(name, loss):
    return {
        "name": name,
        "trainable_params": 10,
        "val_loss": loss,
        "val_ppl": 2.718**loss,
        "tokens_per_sec": 1.0,
        "wall_seconds": 60.0,
        "config": "c.yaml",
        "extra": [],
        "logs": "logs",
    }


def test_seed_groups_and_summary_table(tmp_path):
    rows = [
        row("tiny/gf2", 6.0),
        row("tiny/gf2-seed2", 6.2),
        row("tiny/gf2-seed3", 6.1),
        row("beyond/x", 5.0),
    ]
    assert runs_file.seed_groups(rows) == {"tiny/gf2": [6.0, 6.2, 6.1], "beyond/x": [5.0]}
    runs_file.write_rows(rows, "T", str(tmp_path / "out"), commit="abc")
    table = (tmp_path / "out.md").read_text()
    assert "| tiny/gf2 | 3 | 6.100 | 0.100 | 6.000 | 6.200 |" in table and "commit `abc`" in table
    assert json.loads((tmp_path / "out.json").read_text())["runs"] == rows


class FinishedFit:
    returncode = 0

    def __init__(self, *args, **kwargs):
        pass

    def wait(self, *args):
        return 0


def test_a_resumed_run_says_so_and_records_the_commit_it_started_from(tmp_path, monkeypatch):
    logs, name = tmp_path / "logs", "tiny/binary16"
    run_dir = logs / name / "default"
    (run_dir / "checkpoints").mkdir(parents=True)
    # an earlier attempt's checkpoint (no last link)
    (run_dir / "checkpoints" / "step=00000100.ckpt").write_bytes(b"")
    commits = iter(["at-start", "at-end"])
    monkeypatch.setattr(fit, "git_commit", lambda: next(commits))
    monkeypatch.setattr(fit, "code_changed", lambda: True)
    monkeypatch.setattr(fit.subprocess, "Popen", FinishedFit)  # the fit itself
    monkeypatch.setattr(fit, "finished", lambda d: True)
    monkeypatch.setattr(fit, "curves", lambda d: {"val/loss": [[9, 2.0]]})
    monkeypatch.setattr(fit, "tokens_seen", lambda d: 1000)
    config = fit.ROOT / "experiments" / "tiny" / "binary16.yaml"
    (run_dir / "config.yaml").write_text(json.dumps(resolve(config)))  # what the fit saved
    result = fit.run(name, config, str(logs), [])
    assert (result["commit"], result["code_changed"], result["resumed"]) == ("at-start", True, True)
    assert result["tokens_per_sec"] is None  # the wall time covers the last attempt only
    runs_file.write_rows([result], "T", str(tmp_path / "out"), commit="abc")
    assert (
        "| resumed | " in (tmp_path / "out.md").read_text()
        and "(last attempt)" in (tmp_path / "out.md").read_text()
    )


def test_a_resumed_row_shows_no_rate_even_where_it_carries_one(tmp_path):
    # total tokens over the last attempt's wall time: neither the run's rate nor the last attempt's
    stale = {
        **row("m/lowrank", 5.33),
        "resumed": True,
        "tokens_per_sec": 3373.0,
        "wall_seconds": 262.3,
    }
    runs_file.write_rows([stale, row("m/learned", 5.18)], "T", str(tmp_path / "out"), commit="abc")
    table = (tmp_path / "out.md").read_text()
    assert (
        "| m/lowrank | 10 | 5.330 | 206.3 | resumed | 4.4 (last attempt) |" in table
        and "3,373" not in table
    )
    assert "| m/learned | 10 | 5.180 | 177.6 | 1 | 1.0 |" in table


def test_a_runs_file_changed_in_place_is_refused_in_one_line_naming_it(tmp_path):
    from tests.test_corrupt_contents import flip

    out = str(tmp_path / "out")
    runs_file.write_rows([row("a", 1.0), row("b", 2.0)], "T", out, commit="abc")
    # the same size, other bytes: a study must not resume from or render it
    flip(Path(f"{out}.json"))
    with pytest.raises(
        SystemExit, match=rf"^cannot read the runs file {out}\.json \(\w+: [^\n]*\): restore it"
    ):
        runs_file.read_runs(f"{out}.json")


def test_a_second_writer_of_a_runs_file_is_refused_naming_the_holder(tmp_path):
    """A second study (controls, recodings) on one --out would train and write the same rows."""
    import os

    path = str(tmp_path / "out.json")
    first = runs_file.hold(path)
    runs_file.hold.cache_clear()  # as another process would: it does not hold the lock yet
    with pytest.raises(
        SystemExit,
        match=rf"is in use by another launch \(pid {os.getpid()} .* or pass another --out",
    ):
        runs_file.hold(path)
    first.release()
    assert not list(tmp_path.iterdir())  # released: the lock file gone, nothing stray
