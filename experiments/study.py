"""`make study`: does the learned table's lead over fixed codes depend on model size, or on training length?
-> docs/results/study-v3*.

One backbone family (experiments/study/base.yaml) at three sizes (size-s/m/l.yaml: 0.44M, 1.77M and
4.19M non-embedding parameters, 9.5x apart), each trained on 0.5 tokens per non-embedding parameter
by default, on gutenberg-prose with an 8,192-token BPE (K = 13 bits). Stages, in priority order (a study
stopped early has answered the first questions):

1. ``sweep``: the paper's three variants at every size, seed 1, on a 1-2-3-5 ladder of peak rates
   (``Scale.sweep``); a variant whose best rate is at the edge of what it ran gets the next rung too.
   The rate is chosen on validation bits/byte (9 held-out books); WikiText-2 bits/byte, which no choice
   reads, is the test split.
2. ``sizes``: each variant at its own best rate at each size, every training seed.
3. ``length``: at M, the variants at 1,024 updates (L's tokens: size apart from training length, first),
   and at size S at 432, 1,024 and 1,728 updates (2, 4.7 and 8 tokens per non-embedding parameter), at
   the size's best rates.
4. ``codebooks``: seed s > 1 of gf2 (every size) and random_full (M) with code_seed s, so the spread over
   seeds holds the codebook's.
5. ``controls``: at size M and every seed: a binary16 model widened to the learned model's
   trainable parameters (``matched``), the norm-matched learned table, full-width random codes,
   and the low-rank learned code from its binary start and from a normal start (input LR x10,
   no weight decay, so its entries can move).
6. ``probe`` and ``smollm2`` (not run by default): identity probes on seed 1's checkpoints at M; the
   three variants at size M with the SmolLM2 tokenizer.

A training seed sets the initialisation and the data order (data.seed follows it). Every run is
one row of ``OUT-runs.json`` (flags, commit, curves, scores, wall time): re-running skips finished
rows and resumes a run interrupted mid-way from its checkpoint, so the study can be stopped at any
time and continued with the same command. Rows of study v2 with the same flags are adopted (copied,
not rerun: the same code trains them bit for bit). ``--render`` redraws the report from that file alone.

``--gpu`` swaps in the GPU plan (experiments/study/gpu/: 25M-302M non-embedding parameters, the
SmolLM2 tokenizer, 20 tokens per parameter at every size), ``--estimate`` prints a plan's runs and
its expected compute without running anything.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from collections.abc import Collection
from pathlib import Path

from experiments.runs import ROOT, merged_config, run_all
from experiments.study_plan import (
    CONTROLS,
    METRIC,
    NAME,
    PAPER,
    SIZES,
    WIDTH_FLAG,
    non_embedding_params,
    parse_name,
    widened,
)
from experiments.study_plan import run_name as name
from experiments.study_report import render

STUDY = ROOT / "experiments" / "study"
# Peak rates the sweep may use: 1-2-3-5 steps, so a best rate is known to within a factor of ~1.6.
LADDER = (1e-4, 2e-4, 3e-4, 5e-4, 1e-3, 2e-3, 3e-3, 5e-3, 1e-2, 2e-2, 3e-2)
TOKENIZERS = {"bpe8k": (), "smollm2": (STUDY / "smollm2.yaml",)}
STAGES = ("sweep", "sizes", "length", "codebooks", "controls", "probe", "smollm2")
V2_RUNS = ROOT / "docs" / "results" / "study-v2-runs.json"
# Training FLOP/s for --estimate. GPU: 40 % of an H200's 989 dense bf16 TFLOP/s (an assumption until
# `make bench-gpu` measures the MFU). CPU: the two 1-thread fits of this machine together, measured
# on the study's size-M runs: 1.93e13 FLOPs in 384 s of fit plus eval per run, two at a time.
GPU_RATE = 0.4 * 989e12
CPU_RATE = 1.0e11
STEPS_FLAG = "--trainer.max_steps="


class Scale:
    """A plan's configs, and per size its sweep, its training lengths and its codebook variants.

    CPU: every size is swept (seed 1) around the rate v2 found; S and M also train to L's token count
    (1,024 updates), and S along a training-length axis (0.5, 2, 4.7 and 8 tokens per non-embedding
    parameter); gf2 (every size) and random_full (M) draw another codebook for each further seed.
    GPU: the sweep runs at S only, its best rate serves every size, and there is no length axis.
    """

    def __init__(self, gpu: bool) -> None:
        self.folder = STUDY / "gpu" if gpu else STUDY
        self.sizes = SIZES
        self.tune = "s" if gpu else "m"  # where the controls run (and, on GPU, the only sweep)
        self.tokenizer = "smollm2" if gpu else "bpe8k"
        if gpu:
            self.sweep: dict[str, tuple[float, ...]] = {"s": (3e-4, 1e-3, 3e-3)}
            self.lengths: dict[str, tuple[int, ...]] = {}
            self.codebooks: tuple[tuple[str, str], ...] = ()
        else:
            self.sweep = {"s": (1e-3, 2e-3, 3e-3, 5e-3, 1e-2), "m": (3e-4, 1e-3, 2e-3, 3e-3, 5e-3, 1e-2),
                          "l": (2e-3, 3e-3, 5e-3)}  # fmt: skip
            # M at L's tokens first: with S at L's tokens it separates size from length at equal tokens
            self.lengths = {"m": (1024,), "s": (432, 1024, 1728)}
            self.codebooks = (("l", "gf2"), ("m", "random_full"), ("m", "gf2"), ("s", "gf2"))

    def configs(self, variant: str, size: str, tokenizer: str) -> tuple[Path, ...]:
        scale = (self.folder / "base.yaml",) if self.folder != STUDY else ()
        vocabulary = TOKENIZERS[tokenizer] if tokenizer != self.tokenizer else ()
        return (STUDY / f"{variant}.yaml", *scale, self.folder / f"size-{size}.yaml", *vocabulary)


def step(scale: Scale, size: str, variant: str, lr: float, seed: int, tokenizer: str | None = None,
         steps: int | None = None, code: int | None = None) -> tuple:  # fmt: skip
    """One run: its name, configs and flags. ``steps`` trains that many updates instead of the size's
    (warm-up 10 %, four validations, as every size file has); ``code`` draws that codebook."""
    tokenizer = tokenizer or scale.tokenizer
    configs = scale.configs(variant, size, tokenizer)
    flags = [f"--seed_everything={seed}", f"--model.optimizer.lr={lr:g}"]
    decoder = merged_config(configs)["model"]["decoder"]
    if variant == "matched":
        flags.append(f"{WIDTH_FLAG}{matched_ffn(decoder)}")
    if variant == "random_full":
        flags.append(f"--model.interface.init_args.code_width={decoder['d_model']}")
    if steps is not None:
        if steps % 4:
            raise ValueError(f"study: {steps} updates do not split into 4 validations; give a multiple of 4")
        flags += [f"{STEPS_FLAG}{steps}", f"--trainer.val_check_interval={steps // 4}",
                  f"--model.schedule.warmup_steps={round(steps / 10)}"]  # fmt: skip
    if code is not None:
        flags.append(f"--model.interface.init_args.code_seed={code}")
    return name(tokenizer, size, variant, lr, seed, steps, code), configs, flags


def matched_ffn(decoder: dict) -> int:
    """The SwiGLU width at which a fixed-code model has the learned model's trainable parameters.

    The learned table adds V x d; each unit of SwiGLU width adds 3 d per block, so the width grows
    by V / (3 n_layers), rounded (the counts then agree to within 1.5 d x n_layers parameters).
    """
    return decoder["ffn_dim"] + round(decoder["vocab_size"] / (3 * decoder["n_layers"]))


def sweep_plan(scale: Scale, rates: dict[tuple[str, str], list[float]]) -> list[tuple]:
    """Seed 1 of every (size, variant) at each of its rates; the smallest size first (the cheapest)."""
    return [step(scale, size, variant, lr, 1) for (size, variant), lrs in rates.items() for lr in lrs]


def initial_rates(scale: Scale) -> dict[tuple[str, str], list[float]]:
    return {(size, v): sorted(lrs) for size, lrs in scale.sweep.items() for v in PAPER}


def best_lrs(scale: Scale, rows: dict[str, dict], rates: dict[tuple[str, str], list[float]]) -> tuple[dict, dict]:
    """Each swept (size, variant)'s best rate among its ``rates`` (seed 1), and the rungs still to run.

    A variant whose best rate is the lowest or highest it ran asks for the next rung of the ladder at
    that size, so a best rate is never at the edge of what was tried (unless the ladder ends).
    Returns ``({size: {variant: lr}}, {(size, variant): [lr, ...]})``.
    """
    best: dict[str, dict[str, float]] = {}
    more: dict[tuple[str, str], list[float]] = {}
    for (size, variant), lrs in rates.items():
        scored = {lr: score(rows, name(scale.tokenizer, size, variant, lr, 1)) for lr in lrs}
        scored = {lr: x for lr, x in scored.items() if x is not None}
        if not scored:
            raise SystemExit(f"study: no finished sweep run of {variant} at size {size} ({lrs}): run the sweep")
        lr = best.setdefault(size, {})[variant] = min(scored, key=scored.get)
        rung = LADDER.index(lr) if lr in LADDER else None
        for edge, neighbour in ((min(lrs), -1), (max(lrs), 1)):
            inside = rung is not None and 0 <= rung + neighbour < len(LADDER)
            if inside and lr == edge and LADDER[rung + neighbour] not in lrs:
                more.setdefault((size, variant), []).append(LADDER[rung + neighbour])
    return best, more


def score(rows: dict[str, dict], run_name: str) -> float | None:
    """The run's validation bits/byte; None when it has not run (or logged none); inf when it diverged."""
    row = rows.get(run_name)
    if row is None or row.get(METRIC) is None:
        return None
    return row[METRIC] if math.isfinite(row[METRIC]) else math.inf


def swept(scale: Scale, rows: dict[str, dict]) -> dict[tuple[str, str], list[float]]:
    """The rates each (swept size, paper variant) finished with seed 1 at the size's own length and codebook."""
    rates = {key: set() for key in initial_rates(scale)}
    for n in rows:
        if not NAME.match(n):  # a row of another plan in the file
            continue
        r = parse_name(n)
        own = r["tok"] == scale.tokenizer and r["seed"] == 1 and r["steps"] is None and r["code"] is None
        if own and (r["size"], r["variant"]) in rates:
            rates[(r["size"], r["variant"])].add(r["lr"])
    return {key: sorted(lrs) for key, lrs in rates.items()}


def rate_at(scale: Scale, best: dict[str, dict[str, float]], size: str, variant: str) -> float:
    """A paper variant's rate at ``size``: its own best there, or the tuning size's where it was not swept."""
    return best.get(size, best[scale.tune if scale.tune in best else next(iter(best))])[variant]


def later_plan(scale: Scale, stages: list[str], best: dict[str, dict[str, float]], seeds: list[int]) -> list[tuple]:
    """Stages in priority order (a study stopped early has answered the first questions); seeds outermost
    within a stage, so it has whole seeds."""
    steps = []
    if "sizes" in stages:
        steps += [step(scale, size, v, rate_at(scale, best, size, v), seed) for seed in seeds for size in scale.sizes
                  for v in PAPER]  # fmt: skip
    if "length" in stages:
        steps += [step(scale, size, v, rate_at(scale, best, size, v), seed, steps=n) for seed in seeds
                  for size, lengths in scale.lengths.items() for n in lengths for v in PAPER]  # fmt: skip
    if "codebooks" in stages:  # seed s > 1 draws codebook s: the spread over seeds holds the codebook's
        steps += [step(scale, size, v, rate_at(scale, best, size, CONTROLS.get(v, v)), seed, code=seed)
                  for seed in seeds if seed > 1 for size, v in scale.codebooks]  # fmt: skip
    if "controls" in stages:
        steps += [step(scale, scale.tune, c, rate_at(scale, best, scale.tune, like), seed) for seed in seeds
                  for c, like in CONTROLS.items()]  # fmt: skip
    if "smollm2" in stages and scale.tokenizer != "smollm2":
        steps += [step(scale, scale.tune, v, rate_at(scale, best, scale.tune, v), seed, "smollm2") for seed in seeds
                  for v in PAPER]  # fmt: skip
    return steps


def adoptable(source: Path | None, plan: list[tuple], have: Collection[str] = ()) -> list[dict]:
    """The finished rows of ``source`` (an earlier study's runs file) that are runs of ``plan`` with the same
    flags and not in ``have``, each marked with where it came from."""
    if source is None or not source.is_file():
        return []
    wanted = {n: flags for n, _, flags in plan if n not in have}
    return [{**row, "adopted_from": source.name} for row in json.loads(source.read_text())["runs"]
            if wanted.get(row["name"]) == row["extra"]]  # fmt: skip


def adopt(runs_file: Path, source: Path, plan: list[tuple], title: str) -> int:
    """Copy into ``runs_file`` the :func:`adoptable` rows of ``source``, each keeping its commit; the number
    copied. The same code trains the same run bit for bit on this machine (CPU, fixed seeds), so a copied row
    stands for the run it would be."""
    from experiments.runs import write_rows

    mine = json.loads(runs_file.read_text())["runs"] if runs_file.is_file() else []
    copied = adoptable(source, plan, {row["name"] for row in mine})
    if copied:
        write_rows(mine + copied, title, str(runs_file.with_suffix("")))  # write_rows adds .json
    return len(copied)


def probe(scale: Scale, done: dict[str, dict], best: dict[str, dict[str, float]], out: Path) -> None:
    """Identity probes (held-out positions and held-out token types) on seed 1's checkpoints at the tuning
    size and best rates: every paper variant and control, into ``out/probe.{json,png}`` (kept once written)."""
    if (out / "probe.json").is_file():
        return
    runs = {v: done.get(name(scale.tokenizer, scale.tune, v, rate_at(scale, best, scale.tune, CONTROLS.get(v, v)), 1))
            for v in (*PAPER, *CONTROLS)}  # fmt: skip
    # a row adopted from an earlier study has no checkpoint here
    order = [v for v, row in runs.items() if row is not None and (Path(row["logs"]) / "checkpoints").is_dir()]
    checkpoints = [str(Path(runs[v]["logs"]) / "checkpoints" / "last.ckpt") for v in order]
    args = [sys.executable, "-m", "fixed_embed", "analyze", "probe", *checkpoints, "--labels", *order, "--seed", "1",
            "--data", str(ROOT.parent / "shared/data/gutenberg-prose/valid.jsonl"), "--out", str(out)]  # fmt: skip
    subprocess.run(args, check=True, cwd=ROOT)


# --smoke: the plan's configs, shrunk to 2 updates of tiny batches on this machine's CPU and local data
SMOKE = ["--trainer.accelerator=cpu", "--trainer.precision=32-true", "--trainer.max_steps=2",
         "--trainer.val_check_interval=2", "--model.schedule.warmup_steps=1", "--data.batch_size=1",
         "--data.seq_len=64", "--data.num_workers=0", "--data.val_sequences=9",
         "--data.train=../shared/data/gutenberg-prose/train.jsonl"]  # fmt: skip


def smoke_plan(scale: Scale) -> list[tuple]:
    """The learned model at every size, and every other variant and control at the tuning size."""
    steps = [step(scale, size, "learned", 1e-3, 1) for size in scale.sizes]
    others = [v for v in (*PAPER, *CONTROLS) if v != "learned"]
    return steps + [step(scale, scale.tune, v, 1e-3, 1) for v in others]


def training_targets(config: dict, flags: list[str] = ()) -> int:
    """Prediction targets a run trains on (one device: updates x accumulation x batch x seq_len); a
    ``--trainer.max_steps`` among its ``flags`` (a training-length run's) sets its updates."""
    trainer, data = config["trainer"], config["data"]
    steps = trainer["max_steps"]
    for flag in flags:
        if flag.startswith(STEPS_FLAG):
            steps = int(flag.removeprefix(STEPS_FLAG))
    return steps * trainer.get("accumulate_grad_batches", 1) * data["batch_size"] * data["seq_len"]


def tokens_per_param(configs: tuple[Path, ...]) -> float:
    config = merged_config(configs)
    return training_targets(config) / non_embedding_params(config["model"]["decoder"])


def estimate(steps: list[tuple], flops_per_sec: float, finished: Collection[str] = (),
             adopt: Collection[str] = ()) -> list[str]:  # fmt: skip
    """One line per run (targets, training FLOPs, and hours at ``flops_per_sec``, or "finished" for a run in
    the runs file, "adopt" for one to copy from an earlier runs file) and the total still to run."""
    from fixed_embed.experiment import build_model

    lines, left, counts = [], 0.0, {"finished": 0, "adopt": 0}
    for run_name, configs, flags in steps:
        config = merged_config(configs)
        config["model"]["decoder"] = widened(config["model"]["decoder"], flags)
        targets = training_targets(config, flags)
        flops = targets * build_model(config["model"]).decoder.flops_per_token(config["data"]["seq_len"])
        when = "finished" if run_name in finished else "adopt" if run_name in adopt else None
        if when:
            counts[when] += 1
        else:
            left += flops
        lines.append(f"{run_name:40s} {targets / 1e6:8.1f}M targets {flops:9.3g} FLOPs "
                     f"{when or f'{flops / flops_per_sec / 3600:.2f} h':>9s}")  # fmt: skip
    to_run = len(steps) - sum(counts.values())
    lines.append(
        f"{len(steps)} runs ({counts['finished']} finished, {counts['adopt']} to adopt, {to_run} to run): "
        f"{left:.3g} FLOPs, {left / flops_per_sec / 3600:.1f} h at {flops_per_sec:.3g} FLOP/s"
    )
    return lines


def fully_scored(scale: Scale, rows: dict[str, dict], rates: dict[tuple[str, str], list[float]]) -> dict:
    """The (size, variant)s of ``rates`` whose every rate seed 1 has scored, with their rates."""
    return {(size, v): lrs for (size, v), lrs in rates.items()
            if all(score(rows, name(scale.tokenizer, size, v, lr, 1)) is not None for lr in lrs)}  # fmt: skip


def planned_rates(scale: Scale, rows: dict[str, dict], rates: dict[tuple[str, str], list[float]]) -> tuple[dict, bool]:
    """The rates the later stages run at, for --estimate, and whether any is a guess: each (size, variant)'s
    best where seed 1 has scored every rate of its sweep, else the middle of the size's sweep."""
    best = {size: {v: lrs[len(lrs) // 2] for v in PAPER} for size, lrs in scale.sweep.items()}
    complete = fully_scored(scale, rows, rates)
    if complete:
        for size, by_variant in best_lrs(scale, rows, complete)[0].items():
            best[size].update(by_variant)
    return best, len(complete) < len(rates)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    default = ["sweep", "sizes", "length", "codebooks", "controls"]
    parser.add_argument("--stages", nargs="+", choices=STAGES, default=default,
                        help="what to run, in this order (default: all but probe and smollm2)")  # fmt: skip
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3], help="training seeds (init + data order)")
    parser.add_argument("--jobs", type=int, default=2, help="fits at once, sharing the cores")
    parser.add_argument("--gpu", action="store_true", help="the GPU plan (experiments/study/gpu/)")
    parser.add_argument("--estimate", action="store_true", help="print the plan and its compute; run nothing")
    parser.add_argument("--flops-per-sec", type=float, default=None,
                        help=f"for --estimate; default {CPU_RATE:.3g} (CPU) or {GPU_RATE:.3g} (--gpu)")  # fmt: skip
    parser.add_argument("--logs", default=None, help="default: logs/study-v3 (logs/study-gpu with --gpu)")
    parser.add_argument("--out", default=None, help="default: docs/results/study-v3 (logs/study-gpu/study)")
    parser.add_argument("--adopt", default=None, type=Path,
                        help=f"an earlier runs file whose runs of this plan are copied, not rerun (default: "
                             f"{V2_RUNS.relative_to(ROOT)} for the CPU plan; 'none': rerun everything)")  # fmt: skip
    parser.add_argument("--render", action="store_true", help="only redraw the report from OUT-runs.json")
    parser.add_argument("--smoke", action="store_true",
                        help="each size and variant for 2 updates on CPU, no eval")  # fmt: skip
    parser.add_argument("extra", nargs="*", help="extra fixed-embed fit arguments for every run")
    args = parser.parse_args()
    scale = Scale(args.gpu)
    logs = args.logs or ("logs/study-gpu" if args.gpu else "logs/study-v3")
    out = Path(args.out or (ROOT / "logs" / "study-gpu" / "study" if args.gpu else ROOT / "docs/results/study-v3"))
    runs_file = Path(f"{out}-runs")
    adopt_from = None if args.gpu or args.extra or str(args.adopt) == "none" else (args.adopt or V2_RUNS)
    title = "Study v3: the learned table vs fixed codes across model sizes and training lengths, one row per run"

    def rows() -> dict[str, dict]:
        path = Path(f"{runs_file}.json")
        return {r["name"]: r for r in json.loads(path.read_text())["runs"]} if path.is_file() else {}

    planned: dict[str, tuple] = {}  # --estimate: every stage's runs, each once
    adopted: dict[str, dict] = {}  # --estimate: the rows a launch would adopt before it trains anything

    def known() -> dict[str, dict]:
        return {**adopted, **rows()}

    def go(steps: list[tuple]) -> None:
        steps = [(n, configs, [*flags, *args.extra]) for n, configs, flags in steps]
        if args.estimate:
            planned.update((step[0], step) for step in steps if step[0] not in planned)
            adopted.update((row["name"], row) for row in adoptable(adopt_from, steps, known()))
            return
        if adopt_from is not None and (copied := adopt(Path(f"{runs_file}.json"), adopt_from, steps, title)):
            print(f"study: {copied} runs of this plan adopted from {adopt_from} (same flags; not rerun)")
        run_all(steps, logs, title, str(runs_file), jobs=args.jobs, evaluate="study",
                eval_device="cuda" if args.gpu else "cpu")  # fmt: skip

    if args.gpu and not (args.estimate or args.smoke or args.render):
        _check_gpu_data(scale, args.extra)
    if args.smoke:
        steps = smoke_plan(scale)
        logs, runs_file = f"{logs}-smoke", Path(logs + "-smoke") / "smoke-runs"
        run_all([(n, c, [*f, *SMOKE, *args.extra]) for n, c, f in steps], logs, "smoke", str(runs_file), jobs=1)
        return
    if not args.render:
        # The rungs an earlier launch added at an edge are part of the sweep: the later stages choose among
        # them too (swept), so the sweep must extend from them, not from the plan's first rates alone.
        ran = swept(scale, known())
        rates = {key: sorted({*lrs, *ran[key]}) for key, lrs in initial_rates(scale).items()}
        if "sweep" in args.stages:
            while True:  # extend each variant's rates until its best sits inside them
                go(sweep_plan(scale, rates))
                # --estimate: a rung is known only where the sweep is scored; a planned rung is not, so this ends
                scored = fully_scored(scale, known(), rates) if args.estimate else rates
                more = best_lrs(scale, known(), scored)[1] if scored else {}
                if not more:
                    break
                rates = {key: sorted({*lrs, *more.get(key, ())}) for key, lrs in rates.items()}
        later = [s for s in args.stages if s != "sweep"]
        if later:
            if args.estimate:
                best, _ = planned_rates(scale, known(), rates)
                print("learning rate per size and variant (the sweep's best where seed 1 has scored all its rates, "
                      "else the middle of the size's sweep):", best)  # fmt: skip
            else:
                best, _ = best_lrs(scale, rows(), swept(scale, rows()))
                print("best learning rate per size and variant (sweep, seed 1):", best)
            go(later_plan(scale, later, best, args.seeds))
            if "probe" in later and not args.estimate:
                probe(scale, rows(), best, Path(f"{out}-probe"))
    if args.estimate:
        rate = args.flops_per_sec or (GPU_RATE if args.gpu else CPU_RATE)
        print("\n".join(estimate(list(planned.values()), rate, finished=rows(), adopt=adopted)))
        if not args.render and planned_rates(scale, known(), rates)[1]:  # a later stage's rate is a guess
            print("(assumes each guessed best rate is inside its sweep; a rung added at an edge is one more run, and "
                  "the later stages then run at the best rates)")  # fmt: skip
    elif Path(f"{runs_file}.json").is_file():
        render(json.loads(Path(f"{runs_file}.json").read_text()), out, tune=scale.tune)


def _check_gpu_data(scale: Scale, extra: list[str]) -> None:
    """The GPU plan's token shards are made elsewhere (the hub) and copied: say so before any run starts."""
    if any(flag.startswith("--data.train") for flag in extra):
        return
    train = merged_config(scale.configs("learned", scale.tune, scale.tokenizer))["data"]["train"]
    if not (ROOT / train).exists():
        sys.exit(
            f"study --gpu reads the token shards {train}, which are not here: run `make shards-fineweb` on a "
            "machine that reaches the hub and copy the folder here, or give other data (make study-gpu DATA=...)"
        )


if __name__ == "__main__":
    main()
