"""The study's run names: what the runner (study.py, its plan plan/stages.py) writes, the report
(report/render.py, its runs index report/results.py) reads back."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

import experiments.plan.names as plan
import experiments.plan.stages as stages
import experiments.report.results as results

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = (*plan.PAPER, *plan.CONTROLS)


@pytest.mark.parametrize("tokenizer", ["bpe8k", "smollm2"])
def test_every_name_the_plan_can_write_parses_back_to_its_parts(tokenizer):
    for size in plan.SIZES:
        for variant in VARIANTS:
            for lr in (*stages.LADDER, 3e-5, 0.5, 1.0):
                # the rate in the name is the rate trained (--model.optimizer.lr)
                assert float(f"{lr:g}") == lr
                for seed in (1, 2, 3, 12):
                    for steps in (None, 4, 1728):
                        for code in (None, 2) if variant in plan.CODED else (None,):
                            name = plan.run_name(tokenizer, size, variant, lr, seed, steps, code)
                            parts = {
                                "tok": tokenizer,
                                "size": size,
                                "variant": variant,
                                "lr": lr,
                                "seed": seed,
                                "steps": steps,
                                "code": code,
                            }
                            assert plan.parse_name(name) == parts, name
                            assert results.parse({"name": name}) == parts
                            assert plan.run_name(*parts.values()) == name


def test_only_a_drawn_code_takes_a_code_seed():
    assert plan.run_name("bpe8k", "m", "gf2", 1e-3, 2, code=2) == "bpe8k-m/gf2-lr0.001-seed2-code2"
    with pytest.raises(ValueError, match="binary16 draws no codebook"):
        plan.run_name("bpe8k", "m", "binary16", 1e-3, 2, code=2)


def test_the_runner_names_its_steps_with_the_shared_format():
    for gpu in (False, True):
        scale = stages.Scale(gpu)
        name, _, flags = stages.step(scale, "m", "matched", 3e-3, 2)
        assert plan.parse_name(name) == {
            "tok": scale.tokenizer,
            "size": "m",
            "variant": "matched",
            "lr": 3e-3,
            "seed": 2,
            "steps": None,
            "code": None,
        }
        assert "--model.optimizer.lr=0.003" in flags and "--seed_everything=2" in flags
        # the report reads the width back
        assert any(flag.startswith("--model.decoder.ffn_dim=") for flag in flags)
        name, _, flags = stages.step(scale, "s", "random_full", 1e-3, 3, steps=1024, code=3)
        assert plan.parse_name(name) == {
            "tok": scale.tokenizer,
            "size": "s",
            "variant": "random_full",
            "lr": 1e-3,
            "seed": 3,
            "steps": 1024,
            "code": 3,
        }
        assert (
            "--trainer.max_steps=1024" in flags
            and "--model.interface.init_args.code_seed=3" in flags
        )
    assert stages.name is plan.run_name and stages.PAPER is results.PAPER is plan.PAPER
    assert stages.CONTROLS is results.CONTROLS is plan.CONTROLS


@pytest.mark.parametrize("runs", ["study-v2-runs.json", "study-v3-runs.json"])
def test_every_committed_study_run_name_round_trips(runs):
    rows = json.loads((ROOT / "docs" / "results" / runs).read_text())["runs"]
    assert rows
    for row in rows:
        parts = plan.parse_name(row["name"])
        assert (
            plan.run_name(
                parts["tok"],
                parts["size"],
                parts["variant"],
                parts["lr"],
                parts["seed"],
                parts["steps"],
                parts["code"],
            )
            == row["name"]
        )
        assert f"--model.optimizer.lr={parts['lr']:g}" in row["extra"]
        assert (f"--trainer.max_steps={parts['steps']}" in row["extra"]) == (
            parts["steps"] is not None
        )


@pytest.mark.parametrize(
    "name",
    [
        "tiny/gf2",
        "tiny/gf2-seed2",
        "bpe8k-m/learned-lr0.001",
        "bpe8k-m/learned-seed1",
        "bpe8k/learned-lr0.001-seed1",
        "bpe8k-m/learned-lr0.001-seed1/x",
        "BPE-m/learned-lr0.001-seed1",
        "bpe8k-m/learned-lrfast-seed1",
    ],
)
def test_names_outside_the_format_are_refused(name):
    with pytest.raises(ValueError, match="TOKENIZER-SIZE/VARIANT-lrLR-seedS"):
        plan.parse_name(name)


def test_the_swept_rates_are_read_with_the_parser():
    scale = stages.Scale(False)
    rows = {plan.run_name("bpe8k", "m", v, lr, 1): {} for v in plan.PAPER for lr in (3e-4, 1e-3)}
    rows[plan.run_name("bpe8k", "m", "learned", 3e-3, 1)] = {}  # a rung one variant ran
    rows[plan.run_name("bpe8k", "m", "gf2", 1e-2, 2)] = {}  # seed 2: not the sweep
    rows[
        plan.run_name("bpe8k", "s", "gf2", 1e-2, 1, steps=1024)
    ] = {}  # another length: not the sweep
    rows["tiny/gf2"] = {}  # a row of another plan in the same file
    swept = stages.swept(scale, rows)
    assert swept[("m", "learned")] == [3e-4, 1e-3, 3e-3] and swept[("m", "gf2")] == [3e-4, 1e-3]
    assert swept[("s", "gf2")] == [] and set(swept) == {
        (s, v) for s in scale.sweep for v in plan.PAPER
    }


@pytest.mark.slow
def test_a_runner_runs_as_a_file_as_the_makefile_runs_it():
    """`python experiments/study.py` puts experiments/ on sys.path, not the root: the installed
    package serves."""
    run = subprocess.run(
        [sys.executable, str(ROOT / "experiments" / "study.py"), "--estimate"],
        capture_output=True,
        text=True,
        cwd=ROOT / "docs",
        timeout=120,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert " runs (" in run.stdout and " h at " in run.stdout
