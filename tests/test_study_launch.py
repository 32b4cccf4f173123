"""The study runner (experiments/study.py): `--estimate`'s runs and compute from a plan and its
runs file, a relaunched resweep's edge rung, and the GPU plan's check for its token shards."""

import json
import sys

import pytest

import experiments.plan.stages as stages
import experiments.study as study
from experiments.launch.record import resolve
from experiments.plan.names import PAPER, run_name


def _estimate(monkeypatch, capsys, *args: str) -> tuple[dict[str, list[str]], str]:
    """``study.py --estimate ARGS``: each run's line (name -> the rest, split) and the closing
    total."""
    monkeypatch.setattr(sys, "argv", ["experiments/study.py", "--estimate", *args])
    study.main()
    stdout = capsys.readouterr().out
    runs = [line.split() for line in stdout.splitlines() if " targets " in line]
    assert len(runs) == len({run[0] for run in runs})  # each run once
    return {run[0]: run[1:] for run in runs}, next(
        line for line in stdout.splitlines() if " runs (" in line
    )


def test_the_estimate_lists_every_planned_run_once(tmp_path, monkeypatch, capsys):
    runs, total = _estimate(
        monkeypatch, capsys, "--out", str(tmp_path / "study"), "--adopt", "none"
    )
    # the sweep (each size's rates x 3 variants, seed 1); 3 sizes x 3 variants x 3 seeds (seed 1 of
    # the estimate's best rates is in the sweep); the lengths x 3 variants x 3 seeds; the codebooks
    # for seeds 2-3; 5 controls x 3 seeds
    scale = stages.Scale(False)
    sweep = 3 * sum(map(len, scale.sweep.values()))
    lengths = 3 * 3 * sum(map(len, scale.lengths.values()))
    # each variant's rungs either side (the middle: a length run's seed 1)
    resweep = 3 * 2 * len(scale.resweep)
    n = sweep + resweep + (27 - 9) + lengths + 2 * len(scale.codebooks) + 15
    assert len(runs) == n and total.startswith(f"{n} runs (0 finished, 0 to adopt, {n} to run): ")


def _sweep_rows(scale, best_at: int = 1) -> list[dict]:
    """Seed 1 of every size's sweep, the ``best_at``-th rate of each the best."""
    return [
        {"name": run_name("bpe8k", size, v, lr, 1), "val_bpb": 2.0 - (i == best_at)}
        for size, lrs in scale.sweep.items()
        for v in PAPER
        for i, lr in enumerate(lrs)
    ]


def test_the_estimate_runs_at_the_swept_rates_counts_each_runs_updates_and_skips_finished_runs(
    tmp_path, monkeypatch, capsys
):
    """After a sweep, --estimate plans the later stages at its best rates (not a guess), a
    training-length run at its own updates, and leaves out of the total what the runs file
    already holds."""
    scale, out = stages.Scale(False), tmp_path / "study"
    s = scale.sweep["s"][1]
    rows = [
        *_sweep_rows(scale),
        {"name": run_name("bpe8k", "s", "gf2", s, 2, steps=1728), "val_bpb": 1.0},
    ]
    (tmp_path / "study-runs.json").write_text(json.dumps({"title": "t", "runs": rows}))
    runs, total = _estimate(monkeypatch, capsys, "--out", str(out), "--adopt", "none")
    later = [n for n in runs if n.startswith("bpe8k-s/") and "seed1" not in n]
    assert later and all(f"-lr{s:g}-" in n for n in later)  # the sweep's best, not the middle guess
    short, long = (runs[run_name("bpe8k", "s", "gf2", s, 3, steps=n)] for n in (432, 1728))
    # training FLOPs: 1,728 / 432 updates
    assert float(long[2]) == pytest.approx(4 * float(short[2]), rel=0.01)
    assert (
        runs[run_name("bpe8k", "s", "gf2", s, 2, steps=1728)][-1] == "finished" and long[-1] == "h"
    )
    finished = len(rows)
    assert total.startswith(
        f"{len(runs)} runs ({finished} finished, 0 to adopt, {len(runs) - finished} to run)"
    )


def test_the_estimate_guesses_only_where_a_sweep_is_incomplete_and_counts_adoptable_runs(
    tmp_path, monkeypatch, capsys
):
    """A variant whose sweep lacks a score (a rate not run, a rate that logged nothing, a rung
    its best at an edge asks for) keeps the guess; a swept one uses its best; runs an earlier
    runs file holds with the same flags are to adopt, not to run."""
    scale, out = stages.Scale(False), tmp_path / "study"
    rows = {r["name"]: r for r in _sweep_rows(scale) if not r["name"].startswith("bpe8k-s/gf2-")}
    rows[run_name("bpe8k", "m", "learned", scale.sweep["m"][2], 1)]["val_bpb"] = None
    low = scale.sweep["l"][0]
    rows[run_name("bpe8k", "l", "binary16", low, 1)]["val_bpb"] = (
        0.5  # the best, at the sweep's edge
    )
    (tmp_path / "study-runs.json").write_text(
        json.dumps({"title": "t", "runs": list(rows.values())})
    )
    earlier = tmp_path / "earlier-runs.json"
    # L learned's swept best, seed 2
    control = stages.step(scale, "l", "learned", scale.sweep["l"][1], 2)
    earlier.write_text(
        json.dumps({"runs": [{"name": control[0], "extra": control[2], "val_bpb": 1.0}]})
    )
    runs, total = _estimate(monkeypatch, capsys, "--out", str(out), "--adopt", str(earlier))
    guess = {size: lrs[len(lrs) // 2] for size, lrs in scale.sweep.items()}
    assert run_name("bpe8k", "s", "learned", scale.sweep["s"][1], 2) in runs  # swept: its best
    assert run_name("bpe8k", "s", "gf2", guess["s"], 2) in runs  # never swept
    assert run_name("bpe8k", "m", "learned", guess["m"], 2) in runs  # a rate logged nothing
    # the sweep would add it below the edge best ...
    rung = stages.LADDER[stages.LADDER.index(low) - 1]
    assert runs[run_name("bpe8k", "l", "binary16", rung, 1)][-1] == "h"
    # ... so its best is not known yet
    assert run_name("bpe8k", "l", "binary16", guess["l"], 2) in runs
    assert runs[control[0]][-1] == "adopt" and " 1 to adopt, " in total


def test_the_gpu_plan_reads_token_shards_and_says_how_to_make_them(tmp_path, monkeypatch):
    scale = stages.Scale(True)
    assert resolve(scale.configs("gf2", "m", scale.tokenizer))["data"]["train"].startswith(
        "shards/"
    )
    monkeypatch.setattr(study, "ROOT", tmp_path)
    with pytest.raises(SystemExit, match=r"shards/fineweb-edu-smollm2/.*make shards-fineweb"):
        study._check_gpu_data(scale, [])
    study._check_gpu_data(scale, ["--data.train=/data/other/"])  # DATA= is the user's choice
    (tmp_path / "shards" / "fineweb-edu-smollm2").mkdir(parents=True)
    study._check_gpu_data(scale, [])


def test_a_relaunched_resweep_adds_a_finished_variants_edge_rung_before_the_rest_finish(
    tmp_path, monkeypatch, capsys
):
    """gf2's resweep has scored all its rates, its best at the top edge; the other variants'
    have not: the launch plans gf2's next rung now, beside the unfinished rates, not after them."""
    scale = stages.Scale(False)
    # S's best: 3e-3
    rows = [r for r in _sweep_rows(scale, best_at=2) if r["name"].startswith("bpe8k-s/")]
    rows += [
        {"name": run_name("bpe8k", "s", "gf2", lr, 1, steps=1024), "val_bpb": x}
        for lr, x in ((2e-3, 2.0), (3e-3, 1.9), (5e-3, 1.8))
    ]
    (tmp_path / "study-runs.json").write_text(json.dumps({"title": "t", "runs": rows}))
    runs, _ = _estimate(
        monkeypatch,
        capsys,
        "--out",
        str(tmp_path / "study"),
        "--adopt",
        "none",
        "--stages",
        "resweep",
    )
    # the rung above 5e-3
    assert runs[run_name("bpe8k", "s", "gf2", 1e-2, 1, steps=1024)][-1] == "h"
    assert runs[run_name("bpe8k", "s", "learned", 2e-3, 1, steps=1024)][-1] == "h"
