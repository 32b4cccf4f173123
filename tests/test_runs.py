"""The experiment runner's result files: resumable JSON, a Markdown table, and the seed summary."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))

import runs


def row(name, loss):
    return {"name": name, "trainable_params": 10, "val_loss": loss, "val_ppl": 2.718**loss, "tokens_per_sec": 1.0,
            "wall_seconds": 60.0, "config": "c.yaml", "extra": [], "logs": "logs"}  # fmt: skip


def test_seed_groups_and_summary_table(tmp_path):
    rows = [row("tiny/gf2", 6.0), row("tiny/gf2-seed2", 6.2), row("tiny/gf2-seed3", 6.1), row("beyond/x", 5.0)]
    assert runs.seed_groups(rows) == {"tiny/gf2": [6.0, 6.2, 6.1], "beyond/x": [5.0]}
    runs._write(rows, "T", str(tmp_path / "out"), commit="abc")
    table = (tmp_path / "out.md").read_text()
    assert "| tiny/gf2 | 3 | 6.100 | 0.100 | 6.000 | 6.200 |" in table and "commit `abc`" in table
    assert json.loads((tmp_path / "out.json").read_text())["runs"] == rows


def test_a_partial_plan_keeps_earlier_rows_and_skips_finished_runs(tmp_path, monkeypatch):
    out = str(tmp_path / "out")
    runs._write([row("a", 1.0), row("b", 2.0)], "T", out, commit="abc")
    ran = []
    monkeypatch.setattr(runs, "run", lambda name, *args: ran.append(name) or row(name, 3.0))
    monkeypatch.setattr(runs, "_git_commit", lambda: "def")
    runs.run_all([("b", Path("c.yaml"), []), ("c", Path("c.yaml"), [])], "logs", "T", out)
    assert ran == ["c"]  # b was finished
    assert [r["name"] for r in json.loads(Path(f"{out}.json").read_text())["runs"]] == ["a", "b", "c"]
    with pytest.raises(KeyError):
        runs.seed_groups([{"name": "x"}])
