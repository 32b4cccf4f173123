"""Which runs the study (study.py) makes, stage by stage: the scale (CPU or GPU plan), a run's
name, configs and flags, the learning-rate sweep and the rungs it adds at an edge, the later
stages at each variant's best rate, and the smoke plan. Nothing here runs anything."""

from __future__ import annotations

import math
from pathlib import Path

from experiments.launch.executor import ROOT
from experiments.launch.record import record, resolve
from experiments.plan.names import CONTROLS, METRIC, NAME, PAPER, SIZES, parse_name
from experiments.plan.names import run_name as name
from fixed_embed.config import read_yaml

STUDY = ROOT / "experiments" / "study"
PLANS = read_yaml((STUDY / "plan.yaml").read_text(), str(STUDY / "plan.yaml"))
LADDER: list[float] = PLANS["ladder"]  # the peak rates the sweep may use
SMOKE: list[str] = PLANS["smoke"]  # --smoke's flags


class Scale:
    """A plan's configs, and per size its sweep, its training lengths and its codebook variants
    (experiments/study/plan.yaml: the CPU plan or the GPU plan)."""

    def __init__(self, gpu: bool) -> None:
        self.folder = STUDY / "gpu" if gpu else STUDY
        plan = PLANS["gpu" if gpu else "cpu"]
        self.tune = plan["tune"]  # where the controls run (and, on GPU, the only sweep)
        self.tokenizer = plan["tokenizer"]
        self.sweep: dict[str, list[float]] = plan["sweep"]
        self.lengths: dict[str, list[int]] = plan["lengths"]
        self.resweep: dict[str, int] = plan["resweep"]
        self.codebooks: list[list[str]] = plan["codebooks"]  # (size, variant)

    def configs(self, variant: str, size: str, tokenizer: str) -> tuple[Path, ...]:
        scale = (self.folder / "base.yaml",) if self.folder != STUDY else ()
        vocabulary = (STUDY / f"{tokenizer}.yaml",) if tokenizer != self.tokenizer else ()
        return (STUDY / f"{variant}.yaml", *scale, self.folder / f"size-{size}.yaml", *vocabulary)


def step(
    scale: Scale,
    size: str,
    variant: str,
    lr: float,
    seed: int,
    tokenizer: str | None = None,
    steps: int | None = None,
    code: int | None = None,
) -> tuple:
    """One run: its name, configs and flags. ``steps`` trains that many updates instead of the
    size's (warm-up 10 %, four validations, as every size file has); ``code`` draws that
    codebook."""
    tokenizer = tokenizer or scale.tokenizer
    configs = scale.configs(variant, size, tokenizer)
    flags = [f"--seed_everything={seed}", f"--model.optimizer.lr={lr:g}"]
    decoder = resolve(configs)["model"]["decoder"]
    if variant == "matched":
        flags.append(f"--model.decoder.ffn_dim={matched_ffn(decoder)}")
    if variant == "random_full":
        flags.append(f"--model.interface.init_args.code_width={decoder['d_model']}")
    if steps is not None:
        if steps % 4:
            raise ValueError(
                f"study: {steps} updates do not split into 4 validations; give a multiple of 4"
            )
        flags += [
            f"--trainer.max_steps={steps}",
            f"--trainer.val_check_interval={steps // 4}",
            f"--model.schedule.warmup_steps={round(steps / 10)}",
        ]
    if code is not None:
        flags.append(f"--model.interface.init_args.code_seed={code}")
    return name(tokenizer, size, variant, lr, seed, steps, code), configs, flags


def matched_ffn(decoder: dict) -> int:
    """The SwiGLU width at which a fixed-code model has the learned model's trainable parameters.

    The learned table adds V x d; each unit of SwiGLU width adds 3 d per block, so the width grows
    by V / (3 n_layers), rounded (the counts then agree to within 1.5 d x n_layers parameters).
    """
    return decoder["ffn_dim"] + round(decoder["vocab_size"] / (3 * decoder["n_layers"]))


def sweep_plan(
    scale: Scale, rates: dict[tuple[str, str], list[float]], lengths: dict[str, int] | None = None
) -> list[tuple]:
    """Seed 1 of every (size, variant) at each of its rates, for ``lengths[size]`` updates where
    given (else the size's own); the smallest size first (the cheapest)."""
    lengths = lengths or {}
    return [
        step(scale, size, variant, lr, 1, steps=lengths.get(size))
        for (size, variant), lrs in rates.items()
        for lr in lrs
    ]


def initial_rates(scale: Scale) -> dict[tuple[str, str], list[float]]:
    return {(size, v): sorted(lrs) for size, lrs in scale.sweep.items() for v in PAPER}


def resweep_rates(
    scale: Scale, best: dict[str, dict[str, float]], rows: dict[str, dict]
) -> dict[tuple[str, str], list[float]]:
    """The resweep's first rates: each variant's own-length best and the ladder's rungs either
    side (the edge rule extends them, so its best is still never at an edge of what ran). The
    variant whose own-length best came nearest a tie (the smallest margin of another rate over
    it, seed 1) runs first: a resweep stopped early has answered the least sure choice."""
    rates = {}
    for size in scale.resweep:
        for v in PAPER:
            rung = LADDER.index(best[size][v])
            rates[(size, v)] = LADDER[max(0, rung - 1) : rung + 2]
    return dict(sorted(rates.items(), key=lambda item: _tie(scale, rows, best, *item[0])))


def _tie(
    scale: Scale, rows: dict[str, dict], best: dict[str, dict[str, float]], size: str, variant: str
) -> float:
    """The smallest margin of another own-length rate over the variant's best (inf where none
    has scored)."""
    own = best[size][variant]
    top = score(scale, rows, size, variant, own)
    others = [score(scale, rows, size, variant, lr) for lr in LADDER if lr != own]
    return min((x - top for x in others if None not in (x, top)), default=math.inf)


def best_lrs(
    scale: Scale,
    rows: dict[str, dict],
    rates: dict[tuple[str, str], list[float]],
    lengths: dict[str, int] | None = None,
) -> tuple[dict, dict]:
    """Each swept (size, variant)'s best rate among its ``rates`` (seed 1, at ``lengths[size]``
    updates where given), and the rungs still to run.

    A variant whose best rate is the lowest or highest it ran asks for the next rung of the
    ladder at that size, so a best rate is never at the edge of what was tried (unless the
    ladder ends). Returns ``({size: {variant: lr}}, {(size, variant): [lr, ...]})``.
    """
    best, more = {}, {}
    for (size, variant), lrs in rates.items():
        steps = (lengths or {}).get(size)
        scored = {lr: score(scale, rows, size, variant, lr, steps) for lr in lrs}
        scored = {lr: x for lr, x in scored.items() if x is not None}
        if not scored:
            raise SystemExit(
                f"study: no finished sweep run of {variant} at size {size} ({lrs}): run the sweep"
            )
        lr = best.setdefault(size, {})[variant] = min(scored, key=scored.get)
        if lr not in LADDER:  # off the ladder: no next rung
            continue
        rung = LADDER.index(lr)
        for edge, neighbour in ((min(lrs), rung - 1), (max(lrs), rung + 1)):
            if lr == edge and 0 <= neighbour < len(LADDER) and LADDER[neighbour] not in lrs:
                more.setdefault((size, variant), []).append(LADDER[neighbour])
    return best, more


def score(
    scale: Scale,
    rows: dict[str, dict],
    size: str,
    variant: str,
    lr: float,
    steps: int | None = None,
) -> float | None:
    """Seed 1's validation bits/byte at ``lr`` (and ``steps`` updates where given); None when it
    has not run (or logged none); inf when it diverged."""
    value = rows.get(name(scale.tokenizer, size, variant, lr, 1, steps), {}).get(METRIC)
    return value if value is None or math.isfinite(value) else math.inf


def swept(
    scale: Scale, rows: dict[str, dict], lengths: dict[str, int] | None = None
) -> dict[tuple[str, str], list[float]]:
    """The rates each (swept size, paper variant) finished with seed 1 at the size's own length (or
    ``lengths[size]`` updates: then only the sizes it names) and codebook."""
    lengths = lengths or {}
    rates = {key: set() for key in initial_rates(scale) if not lengths or key[0] in lengths}
    for n in filter(NAME.match, rows):  # not a row of another plan in the file
        r = parse_name(n)
        key = (r["size"], r["variant"])
        if key in rates and n == name(scale.tokenizer, *key, r["lr"], 1, lengths.get(r["size"])):
            rates[key].add(r["lr"])
    return {key: sorted(lrs) for key, lrs in rates.items()}


def rate_at(scale: Scale, best: dict[str, dict[str, float]], size: str, variant: str) -> float:
    """A paper variant's rate at ``size``: its own best there, or the tuning size's where it was
    not swept."""
    return best.get(size, best[scale.tune if scale.tune in best else next(iter(best))])[variant]


def own_steps(scale: Scale, size: str) -> int:
    return record(resolve(scale.configs("learned", size, scale.tokenizer))).updates


def nearest_sweep(steps: int, sweeps: list[int | None], own: int) -> int | None:
    """The sweep whose best rates a run of ``steps`` updates uses: the swept length (None: the
    size's own, ``own`` updates) nearest it in log updates, the size's own on a tie (at S: 432
    updates are 2.4x from 1,024, 4x from 108). The plan runs each length at these rates and the
    report compares it at them."""
    return min(sweeps, key=lambda n: (abs(math.log(steps / (n or own))), n is not None))


def length_rate(
    scale: Scale,
    best: dict[str, dict[str, float]],
    again: dict[str, dict[str, float]],
    size: str,
    variant: str,
    steps: int | None = None,
) -> float:
    """A paper variant's rate at ``size`` trained ``steps`` updates (None: the size's own): the
    resweep's best (``again``) where the size was swept again at a length nearer ``steps`` than
    its own, else the size's own best."""
    sweeps = [None, scale.resweep.get(size)]
    if steps and size in again and nearest_sweep(steps, sweeps, own_steps(scale, size)):
        return again[size][variant]
    return rate_at(scale, best, size, variant)


def later_plan(
    scale: Scale,
    stages: list[str],
    best: dict[str, dict[str, float]],
    seeds: list[int],
    again: dict[str, dict[str, float]] | None = None,
) -> list[tuple]:
    """Stages in priority order (a study stopped early has answered the first questions); seeds
    outermost within a stage, so it has whole seeds, but in the length stage cells outermost, so
    it has whole cells. Each run trains at its (a control's: its paper variant's) rate at its
    size and length; ``again``: the resweep's best rates, for the lengths nearer its length than
    the size's own."""
    runs = []  # (size, variant, seed, step's keywords)
    if "sizes" in stages:
        runs += [(size, v, seed, {}) for seed in seeds for size in SIZES for v in PAPER]
    if "length" in stages:
        runs += [
            (size, v, seed, {"steps": n})
            for size, lengths in scale.lengths.items()
            for n in lengths
            for v in PAPER
            for seed in seeds
        ]
    # seed s > 1 draws codebook s: the spread over seeds holds the codebook's
    if "codebooks" in stages:
        runs += [
            (size, v, seed, {"code": seed})
            for seed in seeds
            if seed > 1
            for size, v in scale.codebooks
        ]
    if "controls" in stages:
        runs += [(scale.tune, c, seed, {}) for seed in seeds for c in CONTROLS]
    if "smollm2" in stages and scale.tokenizer != "smollm2":
        runs += [(scale.tune, v, seed, {"tokenizer": "smollm2"}) for seed in seeds for v in PAPER]
    return [
        step(
            scale,
            size,
            v,
            length_rate(scale, best, again or {}, size, CONTROLS.get(v, v), kw.get("steps")),
            seed,
            **kw,
        )
        for size, v, seed, kw in runs
    ]


def smoke_plan(scale: Scale) -> list[tuple]:
    """The learned model at every size, and every other variant and control at the tuning size."""
    steps = [step(scale, size, "learned", 1e-3, 1) for size in SIZES]
    others = [v for v in (*PAPER, *CONTROLS) if v != "learned"]
    return steps + [step(scale, scale.tune, v, 1e-3, 1) for v in others]


def fully_scored(
    scale: Scale,
    rows: dict[str, dict],
    rates: dict[tuple[str, str], list[float]],
    lengths: dict[str, int] | None = None,
) -> dict:
    """The (size, variant)s of ``rates`` whose every rate seed 1 has scored (at
    ``lengths[size]`` updates where given), with their rates."""
    lengths = lengths or {}
    return {
        (size, v): lrs
        for (size, v), lrs in rates.items()
        if all(score(scale, rows, size, v, lr, lengths.get(size)) is not None for lr in lrs)
    }


def planned_rates(
    scale: Scale, rows: dict[str, dict], rates: dict[tuple[str, str], list[float]]
) -> tuple[dict, bool]:
    """The rates the later stages run at, for --estimate, and whether any is a guess: each
    (size, variant)'s best where seed 1 has scored every rate of its sweep, else the middle of
    the size's sweep."""
    best = {size: {v: lrs[len(lrs) // 2] for v in PAPER} for size, lrs in scale.sweep.items()}
    complete = fully_scored(scale, rows, rates)
    for size, by_variant in best_lrs(scale, rows, complete)[0].items():
        best[size].update(by_variant)
    return best, len(complete) < len(rates)
