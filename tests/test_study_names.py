"""The study's run names: what the runner (study.py) writes, the report (study_report.py) reads back."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

import experiments.study as study
import experiments.study_plan as plan
import experiments.study_report as study_report

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = (*plan.PAPER, *plan.CONTROLS)


@pytest.mark.parametrize("tokenizer", sorted(study.TOKENIZERS))
def test_every_name_the_plan_can_write_parses_back_to_its_parts(tokenizer):
    for size in plan.SIZES:
        for variant in VARIANTS:
            for lr in (*study.LADDER, 3e-5, 0.5, 1.0):
                assert float(f"{lr:g}") == lr  # the rate in the name is the rate trained (--model.optimizer.lr)
                for seed in (1, 2, 3, 12):
                    name = plan.run_name(tokenizer, size, variant, lr, seed)
                    parts = {"tok": tokenizer, "size": size, "variant": variant, "lr": lr, "seed": seed}
                    assert plan.parse_name(name) == parts, name
                    assert study_report.parse({"name": name}) == parts
                    assert plan.run_name(*parts.values()) == name


def test_the_runner_names_its_steps_with_the_shared_format():
    for gpu in (False, True):
        scale = study.Scale(gpu)
        name, _, flags = study.step(scale, "m", "matched", 3e-3, 2)
        assert plan.parse_name(name) == {"tok": scale.tokenizer, "size": "m", "variant": "matched", "lr": 3e-3,
                                         "seed": 2}  # fmt: skip
        assert "--model.optimizer.lr=0.003" in flags and "--seed_everything=2" in flags
        assert any(flag.startswith(plan.WIDTH_FLAG) for flag in flags)  # the report reads the width back
    assert study.name is plan.run_name and study.PAPER is study_report.PAPER is plan.PAPER
    assert study.CONTROLS is study_report.CONTROLS is plan.CONTROLS


def test_every_committed_study_run_name_round_trips():
    rows = json.loads((ROOT / "docs" / "results" / "study-v2-runs.json").read_text())["runs"]
    assert rows
    for row in rows:
        parts = plan.parse_name(row["name"])
        assert plan.run_name(**{"tokenizer": parts["tok"], "size": parts["size"], "variant": parts["variant"],
                                "lr": parts["lr"], "seed": parts["seed"]}) == row["name"]  # fmt: skip
        assert f"--model.optimizer.lr={parts['lr']:g}" in row["extra"]


@pytest.mark.parametrize(
    "name",
    ["tiny/gf2", "tiny/gf2-seed2", "bpe8k-m/learned-lr0.001", "bpe8k-m/learned-seed1", "bpe8k/learned-lr0.001-seed1",
     "bpe8k-m/learned-lr0.001-seed1/x", "BPE-m/learned-lr0.001-seed1", "bpe8k-m/learned-lrfast-seed1"],
)  # fmt: skip
def test_names_outside_the_format_are_refused(name):
    with pytest.raises(ValueError, match="TOKENIZER-SIZE/VARIANT-lrLR-seedS"):
        plan.parse_name(name)


def test_the_swept_rates_are_read_with_the_parser():
    scale = study.Scale(False)
    rows = {plan.run_name("bpe8k", "m", v, lr, 1): {} for v in plan.PAPER for lr in (3e-4, 1e-3)}
    rows[plan.run_name("bpe8k", "m", "learned", 3e-3, 1)] = {}  # one variant only: not swept by all
    rows[plan.run_name("bpe8k", "m", "gf2", 1e-2, 2)] = {}  # seed 2: not the sweep
    rows["tiny/gf2"] = {}  # a row of another plan in the same file
    assert study.swept(scale, rows) == [3e-4, 1e-3]


@pytest.mark.slow
def test_a_runner_runs_as_a_file_as_the_makefile_runs_it():
    """`python experiments/study.py` puts experiments/ on sys.path, not the root: the installed package serves."""
    run = subprocess.run([sys.executable, str(ROOT / "experiments" / "study.py"), "--estimate"], capture_output=True,
                         text=True, cwd=ROOT / "docs", timeout=120)  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    assert " runs: " in run.stdout
