"""`make study`: does the learned table's lead over fixed codes depend on model size, or on
training length?
-> docs/results/study-v3*.

One backbone family (experiments/study/base.yaml) at three sizes (size-s/m/l.yaml: 0.44M, 1.77M and
4.19M non-embedding parameters, 9.5x apart), each trained on 0.5 tokens per non-embedding parameter
by default, on gutenberg-prose with an 8,192-token BPE (K = 13 bits). Stages, in priority order
(a study stopped early has answered the first questions):

1. ``sweep``: the paper's three variants at every size, seed 1, on a 1-2-3-5 ladder of peak rates
   (``Scale.sweep``); a variant whose best rate is at the edge of what it ran gets the next rung
   too. The rate is chosen on validation bits/byte (9 held-out books); WikiText-2 bits/byte,
   which no choice reads, is the test split.
2. ``resweep``: at S, seed 1 of each variant at 1,024 updates, at its own-length best rate and
the ladder's
   rungs either side, extended at an edge as the sweep is: the rates of the length runs nearer 1,024
   updates than S's own 108 in log updates (all of S's: 432, 1,024 and 1,728).
3. ``sizes``: each variant at its own best rate at each size, every training seed.
4. ``length``: at M, the variants at 1,024 updates (L's tokens: size apart from training length,
first),
   and at size S at 1,024, 432 and 1,728 updates (4.7, 2 and 8 tokens per non-embedding
   parameter), at the size's best rates (S: the resweep's, once it has finished).
5. ``codebooks``: seed s > 1 of gf2 (every size) and random_full (M) with code_seed s, so the
spread over
   seeds holds the codebook's.
6. ``controls``: at size M and every seed: a binary16 model widened to the learned model's
   trainable parameters (``matched``), the norm-matched learned table, full-width random codes,
   and the low-rank learned code from its binary start and from a normal start (input LR x10,
   no weight decay, so its entries can move).
7. ``probe`` and ``smollm2`` (not run by default): identity probes on seed 1's checkpoints at M; the
   three variants at size M with the SmolLM2 tokenizer.

A training seed sets the initialisation and the data order (data.seed follows it). Every run is
one row of ``OUT-runs.json`` (flags, commit, curves, scores, wall time): re-running skips finished
rows and resumes a run interrupted mid-way from its checkpoint, so the study can be stopped at any
time and continued with the same command. Rows of study v2 with the same flags are adopted (copied,
not rerun: the same code trains them bit for bit). ``--render`` redraws the report from that
file alone.

``--gpu`` swaps in the GPU plan (experiments/study/gpu/: 25M-302M non-embedding parameters, the
SmolLM2 tokenizer, 20 tokens per parameter at every size), ``--estimate`` prints a plan's runs and
its expected compute without running anything.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Collection
from pathlib import Path

from experiments.launch.executor import ROOT, add_arguments
from experiments.launch.grid import launch
from experiments.launch.record import resolve
from experiments.launch.runs_file import read_runs, rows_by_name, write_rows
from experiments.plan.estimate import CPU_RATE, GPU_RATE, estimate, wall_hours
from experiments.plan.names import CONTROLS, PAPER
from experiments.plan.names import run_name as name
from experiments.plan.stages import (
    SMOKE,
    Scale,
    best_lrs,
    fully_scored,
    initial_rates,
    later_plan,
    planned_rates,
    rate_at,
    resweep_rates,
    smoke_plan,
    sweep_plan,
    swept,
)
from experiments.report.render import render

STAGES = ("sweep", "resweep", "sizes", "length", "codebooks", "controls", "probe", "smollm2")
V2_RUNS = ROOT / "docs" / "results" / "study-v2-runs.json"
TITLE = (
    "Study v3: the learned table vs fixed codes across model sizes and training lengths, one row "
    "per run"
)


def adoptable(source: Path | None, plan: list[tuple], have: Collection[str]) -> list[dict]:
    """The finished rows of ``source`` (an earlier study's runs file) that are runs of ``plan``
    with the same flags and not in ``have``, each marked with where it came from."""
    if source is None or not source.is_file():
        return []
    wanted = {n: flags for n, _, flags in plan if n not in have}
    return [
        {**row, "adopted_from": source.name}
        for row in read_runs(source)["runs"]
        if wanted.get(row["name"]) == row["extra"]
    ]


def probe(
    scale: Scale, done: dict[str, dict], best: dict[str, dict[str, float]], out: Path
) -> None:
    """Identity probes (held-out positions and held-out token types) on seed 1's checkpoints at
    the tuning size and best rates: every paper variant and control, into
    ``out/probe.{json,png}`` (kept once written)."""
    if (out / "probe.json").is_file():
        return
    checkpoints = {}
    for v in (*PAPER, *CONTROLS):
        lr = rate_at(scale, best, scale.tune, CONTROLS.get(v, v))
        row = done.get(name(scale.tokenizer, scale.tune, v, lr, 1))
        # a row adopted from an earlier study has no checkpoint here
        if row is not None and (Path(row["logs"]) / "checkpoints").is_dir():
            checkpoints[v] = str(Path(row["logs"]) / "checkpoints" / "last.ckpt")
    args = [
        sys.executable,
        "-m",
        "fixed_embed",
        "analyze",
        "probe",
        *checkpoints.values(),
        "--labels",
        *checkpoints,
        "--seed",
        "1",
        "--data",
        str(ROOT.parent / "shared/data/gutenberg-prose/valid.jsonl"),
        "--out",
        str(out),
    ]
    subprocess.run(args, check=True, cwd=ROOT)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--stages",
        nargs="+",
        choices=STAGES,
        default=STAGES[:-2],
        help="what to run, in this order (default: all but probe and smollm2)",
    )
    parser.add_argument(
        "--seeds", type=int, nargs="+", default=[1, 2, 3], help="training seeds (init + data order)"
    )
    parser.add_argument("--gpu", action="store_true", help="the GPU plan (experiments/study/gpu/)")
    parser.add_argument(
        "--estimate", action="store_true", help="print the plan and its compute; run nothing"
    )
    parser.add_argument(
        "--flops-per-sec",
        type=float,
        help=f"for --estimate; default {CPU_RATE:.3g} (CPU) or {GPU_RATE:.3g} (--gpu)",
    )
    parser.add_argument("--logs", help="default: logs/study-v3 (logs/study-gpu with --gpu)")
    parser.add_argument("--out", help="default: docs/results/study-v3 (logs/study-gpu/study)")
    parser.add_argument(
        "--adopt",
        type=Path,
        help=f"an earlier runs file whose runs of this plan are copied, not rerun (default: "
        f"{V2_RUNS.relative_to(ROOT)} for the CPU plan; 'none': rerun everything)",
    )
    parser.add_argument(
        "--render", action="store_true", help="only redraw the report from OUT-runs.json"
    )
    parser.add_argument(
        "--smoke", action="store_true", help="each size and variant for 2 updates on CPU, no eval"
    )
    parser.add_argument("extra", nargs="*", help="extra fixed-embed fit arguments for every run")
    add_arguments(parser, jobs=2)
    return parser


class Launch:
    """One pass through the study's stages, in order: each stage's runs launched (a stage waits
    for the one before: its rates come from it) or, for ``--estimate`` and ``--status``,
    collected with the rows a launch would adopt."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args, self.scale = args, Scale(args.gpu)
        self.logs = args.logs or ("logs/study-gpu" if args.gpu else "logs/study-v3")
        self.out = Path(
            args.out or ROOT / ("logs/study-gpu/study" if args.gpu else "docs/results/study-v3")
        )
        self.runs_file = f"{self.out}-runs"
        no_adopt = args.gpu or args.extra or str(args.adopt) == "none"
        self.adopt_from = None if no_adopt else (args.adopt or V2_RUNS)
        self.dry = args.estimate or args.status
        self.planned: dict[str, tuple] = {}  # every stage's runs, each once
        self.stages: list[list[tuple]] = []  # the runs of each stage
        self.adopted: dict[str, dict] = {}

    def rows(self) -> dict[str, dict]:
        return rows_by_name(self.runs_file)

    def known(self) -> dict[str, dict]:
        return {**self.adopted, **self.rows()}

    def go(self, steps: list[tuple]) -> None:
        steps = [(n, configs, [*flags, *self.args.extra]) for n, configs, flags in steps]
        self.stages.append([step for step in steps if step[0] not in self.planned])
        for step in steps:
            self.planned.setdefault(step[0], step)
        adopted = adoptable(self.adopt_from, steps, self.known())
        if self.dry:
            self.adopted.update((row["name"], row) for row in adopted)
            return
        # The same code trains the same run bit for bit on this machine (CPU, fixed seeds), so a
        # copied row, keeping its commit, stands for the run it would be.
        if adopted:
            write_rows([*self.rows().values(), *adopted], TITLE, self.runs_file)
            print(
                f"study: {len(adopted)} runs of this plan adopted from {self.adopt_from} (same "
                "flags; not rerun)"
            )
        device = "cuda" if self.args.gpu else "cpu"
        launch(
            steps, self.logs, TITLE, self.runs_file, self.args, evaluate="study", eval_device=device
        )

    def sweep(self, rates: dict, stage: str, lengths: dict[str, int] | None = None) -> dict:
        """``rates`` and the rungs an earlier launch added at an edge: the later stages choose
        among them too (swept), so a sweep extends from them, not from its first rates alone.
        With ``stage`` asked for, swept (seed 1), each variant's next rung while its best
        sits at an edge; the rates run. A variant whose rates have all scored gets its rung
        before the launch runs, alongside the unfinished."""
        ran = swept(self.scale, self.known(), lengths)
        rates = {key: sorted({*lrs, *ran[key]}) for key, lrs in rates.items()}
        if stage not in self.args.stages:
            return rates
        launched = False
        while True:
            # --estimate: a rung is known only where the sweep is scored; a planned rung is not, so
            # this ends
            scored = fully_scored(self.scale, self.known(), rates, lengths)
            more = best_lrs(self.scale, self.known(), scored, lengths)[1] if scored else {}
            grown = {key: sorted({*lrs, *more.get(key, ())}) for key, lrs in rates.items()}
            if launched and grown == rates:
                return rates
            rates, launched = grown, True
            self.go(sweep_plan(self.scale, rates, lengths))

    def walk(self) -> dict:
        """Every stage asked for, in order; the sweep's rates."""
        scale, stages = self.scale, self.args.stages
        rates = self.sweep(initial_rates(scale), "sweep")
        later = [s for s in stages if s not in ("sweep", "resweep")]
        if not (later or "resweep" in stages):
            return rates
        best = self.best(rates)
        again = self.sweep(resweep_rates(scale, best, self.known()), "resweep", scale.resweep)
        found = resweep_best(scale, self.known(), again)
        if found:
            print("best learning rate at the resweep's length (seed 1):", found)
        self.go(later_plan(scale, later, best, self.args.seeds, found))
        if "probe" in later and not self.dry:
            probe(scale, self.rows(), best, Path(f"{self.out}-probe"))
        return rates

    def best(self, rates: dict) -> dict[str, dict[str, float]]:
        """The rates the later stages run at (for --estimate and --status, guessed where the
        sweep has not scored)."""
        if self.dry:
            best, _ = planned_rates(self.scale, self.known(), rates)
            print(
                "learning rate per size and variant (the sweep's best where seed 1 has scored all "
                "its rates, else the middle of the size's sweep):",
                best,
            )
        else:
            best, _ = best_lrs(self.scale, self.rows(), swept(self.scale, self.rows()))
            print("best learning rate per size and variant (sweep, seed 1):", best)
        return best

    def estimate(self, rates: dict | None) -> None:
        """The planned runs' compute (``rates``: the sweep's, None with --render)."""
        args, rows = self.args, self.rows()
        rate = args.flops_per_sec or (GPU_RATE if args.gpu else CPU_RATE)
        runs = list(self.planned.values())
        print("\n".join(estimate(runs, rate, finished=rows, adopt=self.adopted)))
        hours = wall_hours(self.stages, rate, args.jobs, skip={*rows, *self.adopted})
        print(
            f"wall time at {args.jobs} runs at once ({len(self.stages)} stages, each after the one "
            f"before): {hours:.1f} h"
        )
        if rates is not None and planned_rates(self.scale, self.known(), rates)[1]:
            print(  # a later stage's rate is a guess
                "(assumes each guessed best rate is inside its sweep; a rung added at an edge is "
                "one more run, and the later stages then run at the best rates)"
            )


def main() -> None:
    args = _parser().parse_args()
    study = Launch(args)
    if args.gpu and not (study.dry or args.smoke or args.render):
        _check_gpu_data(study.scale, args.extra)
    if args.smoke:
        logs = f"{study.logs}-smoke"
        steps = [(n, c, [*f, *SMOKE, *args.extra]) for n, c, f in smoke_plan(study.scale)]
        launch(steps, logs, "smoke", str(Path(logs) / "smoke-runs"), args)
        return
    rates = None if args.render else study.walk()
    if args.status:
        launch(list(study.planned.values()), study.logs, TITLE, study.runs_file, args)
    elif args.estimate:
        study.estimate(rates)
    elif Path(f"{study.runs_file}.json").is_file():
        adoption = Path(f"{study.out}-adoption.json")
        render(read_runs(f"{study.runs_file}.json"), study.out, study.scale.tune, adoption)


def resweep_best(scale: Scale, rows: dict[str, dict], rates: dict) -> dict[str, dict[str, float]]:
    """The resweep's best rate per size and variant, for each size whose resweep has finished:
    every rate scored and no variant's best at an edge (else the length stage keeps the size's
    own best rates)."""
    scored = fully_scored(scale, rows, rates, scale.resweep)
    found, more = best_lrs(scale, rows, scored, scale.resweep) if scored else ({}, {})
    return {
        size: by_v
        for size, by_v in found.items()
        if all((size, v) in scored and (size, v) not in more for v in PAPER)
    }


def _check_gpu_data(scale: Scale, extra: list[str]) -> None:
    """The GPU plan's token shards are made elsewhere (the hub) and copied: say so before any
    run starts."""
    if any(flag.startswith("--data.train") for flag in extra):
        return
    train = resolve(scale.configs("learned", scale.tune, scale.tokenizer))["data"]["train"]
    if not (ROOT / train).exists():
        sys.exit(
            f"study --gpu reads the token shards {train}, which are not here: run `make "
            "shards-fineweb` on a "
            "machine that reaches the hub and copy the folder here, or give other data (make "
            "study-gpu DATA=...)"
        )


if __name__ == "__main__":
    main()
