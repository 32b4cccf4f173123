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

from experiments.launch.executor import ROOT, add_arguments, executor_for
from experiments.launch.fit import merged_config
from experiments.launch.grid import run_all, status
from experiments.launch.runs_file import read_runs
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


def adoptable(source: Path | None, plan: list[tuple], have: Collection[str] = ()) -> list[dict]:
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


def adopt(runs_file: Path, source: Path, plan: list[tuple], title: str) -> int:
    """Copy into ``runs_file`` the :func:`adoptable` rows of ``source``, each keeping its
    commit; the number copied. The same code trains the same run bit for bit on this machine
    (CPU, fixed seeds), so a copied row stands for the run it would be."""
    from experiments.launch.runs_file import write_rows

    mine = read_runs(runs_file)["runs"] if runs_file.is_file() else []
    copied = adoptable(source, plan, {row["name"] for row in mine})
    if copied:
        write_rows(mine + copied, title, str(runs_file.with_suffix("")))  # write_rows adds .json
    return len(copied)


def probe(
    scale: Scale, done: dict[str, dict], best: dict[str, dict[str, float]], out: Path
) -> None:
    """Identity probes (held-out positions and held-out token types) on seed 1's checkpoints at
    the tuning size and best rates: every paper variant and control, into
    ``out/probe.{json,png}`` (kept once written)."""
    if (out / "probe.json").is_file():
        return
    runs = {
        v: done.get(
            name(
                scale.tokenizer,
                scale.tune,
                v,
                rate_at(scale, best, scale.tune, CONTROLS.get(v, v)),
                1,
            )
        )
        for v in (*PAPER, *CONTROLS)
    }
    # a row adopted from an earlier study has no checkpoint here
    order = [
        v
        for v, row in runs.items()
        if row is not None and (Path(row["logs"]) / "checkpoints").is_dir()
    ]
    checkpoints = [str(Path(runs[v]["logs"]) / "checkpoints" / "last.ckpt") for v in order]
    args = [
        sys.executable,
        "-m",
        "fixed_embed",
        "analyze",
        "probe",
        *checkpoints,
        "--labels",
        *order,
        "--seed",
        "1",
        "--data",
        str(ROOT.parent / "shared/data/gutenberg-prose/valid.jsonl"),
        "--out",
        str(out),
    ]
    subprocess.run(args, check=True, cwd=ROOT)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    default = ["sweep", "resweep", "sizes", "length", "codebooks", "controls"]
    parser.add_argument(
        "--stages",
        nargs="+",
        choices=STAGES,
        default=default,
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
        default=None,
        help=f"for --estimate; default {CPU_RATE:.3g} (CPU) or {GPU_RATE:.3g} (--gpu)",
    )
    parser.add_argument(
        "--logs", default=None, help="default: logs/study-v3 (logs/study-gpu with --gpu)"
    )
    parser.add_argument(
        "--out", default=None, help="default: docs/results/study-v3 (logs/study-gpu/study)"
    )
    parser.add_argument(
        "--adopt",
        default=None,
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
    args = parser.parse_args()
    scale = Scale(args.gpu)
    logs = args.logs or ("logs/study-gpu" if args.gpu else "logs/study-v3")
    out = Path(
        args.out
        or (ROOT / "logs" / "study-gpu" / "study" if args.gpu else ROOT / "docs/results/study-v3")
    )
    runs_file = Path(f"{out}-runs")
    adopt_from = (
        None if args.gpu or args.extra or str(args.adopt) == "none" else (args.adopt or V2_RUNS)
    )
    title = (
        "Study v3: the learned table vs fixed codes across model sizes and training lengths, "
        "one row per run"
    )

    def rows() -> dict[str, dict]:
        path = Path(f"{runs_file}.json")
        return {r["name"]: r for r in read_runs(path)["runs"]} if path.is_file() else {}

    planned: dict[str, tuple] = {}  # --estimate, --status: every stage's runs, each once
    stages: list[
        list[tuple]
    ] = []  # --estimate: the runs of each go(), which waits for the one before
    adopted: dict[
        str, dict
    ] = {}  # --estimate: the rows a launch would adopt before it trains anything

    def known() -> dict[str, dict]:
        return {**adopted, **rows()}

    def go(steps: list[tuple]) -> None:
        steps = [(n, configs, [*flags, *args.extra]) for n, configs, flags in steps]
        if args.estimate or args.status:
            stages.append([step for step in steps if step[0] not in planned])
            planned.update((step[0], step) for step in steps if step[0] not in planned)
            adopted.update((row["name"], row) for row in adoptable(adopt_from, steps, known()))
            return
        if adopt_from is not None and (
            copied := adopt(Path(f"{runs_file}.json"), adopt_from, steps, title)
        ):
            print(
                f"study: {copied} runs of this plan adopted from {adopt_from} (same flags; not "
                "rerun)"
            )
        run_all(
            steps,
            logs,
            title,
            str(runs_file),
            evaluate="study",
            eval_device="cuda" if args.gpu else "cpu",
            executor=executor_for(args, Path(logs) / "jobs"),
        )

    if args.gpu and not (args.estimate or args.smoke or args.render or args.status):
        _check_gpu_data(scale, args.extra)
    if args.smoke:
        steps = smoke_plan(scale)
        logs, runs_file = f"{logs}-smoke", Path(logs + "-smoke") / "smoke-runs"
        steps = [(n, c, [*f, *SMOKE, *args.extra]) for n, c, f in steps]
        if args.status:
            print(
                "\n".join(
                    status(steps, logs, str(runs_file), executor_for(args, Path(logs) / "jobs"))
                )
            )
        else:
            run_all(
                steps,
                logs,
                "smoke",
                str(runs_file),
                executor=executor_for(args, Path(logs) / "jobs"),
            )
        return

    def extend(rates: dict, lengths: dict[str, int] | None = None) -> dict:
        """Sweep ``rates`` (seed 1), each variant's next rung while its best sits at an edge;
        the rates run. A variant whose rates have all scored gets its rung before the launch
        runs, alongside the unfinished."""
        launched = False
        while True:
            # --estimate: a rung is known only where the sweep is scored; a planned rung is not, so
            # this ends
            scored = fully_scored(scale, known(), rates, lengths)
            more = best_lrs(scale, known(), scored, lengths)[1] if scored else {}
            grown = {key: sorted({*lrs, *more.get(key, ())}) for key, lrs in rates.items()}
            if launched and grown == rates:
                return rates
            rates, launched = grown, True
            go(sweep_plan(scale, rates, lengths))

    if not args.render:
        # The rungs an earlier launch added at an edge are part of the sweep: the later stages
        # choose among them too (swept), so the sweep must extend from them, not from the plan's
        # first rates alone.
        ran = swept(scale, known())
        rates = {key: sorted({*lrs, *ran[key]}) for key, lrs in initial_rates(scale).items()}
        if "sweep" in args.stages:
            rates = extend(rates)
        later = [s for s in args.stages if s not in ("sweep", "resweep")]
        if later or "resweep" in args.stages:
            if args.estimate or args.status:
                best, _ = planned_rates(scale, known(), rates)
                print(
                    "learning rate per size and variant (the sweep's best where seed 1 has scored "
                    "all its rates, "
                    "else the middle of the size's sweep):",
                    best,
                )
            else:
                best, _ = best_lrs(scale, rows(), swept(scale, rows()))
                print("best learning rate per size and variant (sweep, seed 1):", best)
            ran = swept(scale, known(), scale.resweep)
            again = {
                key: sorted({*lrs, *ran[key]})
                for key, lrs in resweep_rates(scale, best, known()).items()
            }
            if "resweep" in args.stages:
                again = extend(again, scale.resweep)
            found = resweep_best(scale, known(), again)
            if found:
                print("best learning rate at the resweep's length (seed 1):", found)
            go(later_plan(scale, later, best, args.seeds, found))
            if "probe" in later and not (args.estimate or args.status):
                probe(scale, rows(), best, Path(f"{out}-probe"))
    if args.status:
        print(
            "\n".join(
                status(
                    list(planned.values()),
                    logs,
                    str(runs_file),
                    executor_for(args, Path(logs) / "jobs"),
                )
            )
        )
    elif args.estimate:
        rate = args.flops_per_sec or (GPU_RATE if args.gpu else CPU_RATE)
        print("\n".join(estimate(list(planned.values()), rate, finished=rows(), adopt=adopted)))
        hours = wall_hours(stages, rate, args.jobs, skip={*rows(), *adopted})
        print(
            f"wall time at {args.jobs} runs at once ({len(stages)} stages, each after the one "
            f"before): {hours:.1f} h"
        )
        if (
            not args.render and planned_rates(scale, known(), rates)[1]
        ):  # a later stage's rate is a guess
            print(
                "(assumes each guessed best rate is inside its sweep; a rung added at an edge is "
                "one more run, and "
                "the later stages then run at the best rates)"
            )
    elif Path(f"{runs_file}.json").is_file():
        render(
            read_runs(f"{runs_file}.json"),
            out,
            tune=scale.tune,
            adoption=Path(f"{out}-adoption.json"),
        )


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
    train = merged_config(scale.configs("learned", scale.tune, scale.tokenizer))["data"]["train"]
    if not (ROOT / train).exists():
        sys.exit(
            f"study --gpu reads the token shards {train}, which are not here: run `make "
            "shards-fineweb` on a "
            "machine that reaches the hub and copy the folder here, or give other data (make "
            "study-gpu DATA=...)"
        )


if __name__ == "__main__":
    main()
