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

STUDY = ROOT / "experiments" / "study"
# Peak rates the sweep may use: 1-2-3-5 steps, so a best rate is known to within a factor of ~1.6.
LADDER = (1e-4, 2e-4, 3e-4, 5e-4, 1e-3, 2e-3, 3e-3, 5e-3, 1e-2, 2e-2, 3e-2)
TOKENIZERS = {"bpe8k": (), "smollm2": (STUDY / "smollm2.yaml",)}


class Scale:
    """A plan's configs, and per size its sweep, its training lengths and its codebook variants.

    CPU: every size is swept (seed 1) around the rate v2 found; S and M also train to L's token
    count (1,024 updates), and S along a training-length axis (0.5, 2, 4.7 and 8 tokens per
    non-embedding parameter), its rates swept again at 1,024 updates (``resweep``); gf2 (every
    size) and random_full (M) draw another codebook for each further seed.
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
            self.resweep: dict[str, int] = {}
            self.codebooks: tuple[tuple[str, str], ...] = ()
        else:
            self.sweep = {
                "s": (1e-3, 2e-3, 3e-3, 5e-3, 1e-2),
                "m": (3e-4, 1e-3, 2e-3, 3e-3, 5e-3, 1e-2),
                "l": (2e-3, 3e-3, 5e-3),
            }
            # M at L's tokens first: with S at L's tokens it separates size from length at equal
            # tokens
            self.lengths = {"m": (1024,), "s": (1024, 432, 1728)}
            # S's axis reaches 16x its own 108 updates, where a rate chosen at 108 may no longer be
            # best
            self.resweep = {"s": 1024}
            self.codebooks = (("l", "gf2"), ("m", "random_full"), ("m", "gf2"), ("s", "gf2"))

    def configs(self, variant: str, size: str, tokenizer: str) -> tuple[Path, ...]:
        scale = (self.folder / "base.yaml",) if self.folder != STUDY else ()
        vocabulary = TOKENIZERS[tokenizer] if tokenizer != self.tokenizer else ()
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
            rates[(size, v)] = list(LADDER[max(0, rung - 1) : rung + 2])
    return dict(sorted(rates.items(), key=lambda item: _tie(scale, rows, best, *item[0])))


def _tie(
    scale: Scale, rows: dict[str, dict], best: dict[str, dict[str, float]], size: str, variant: str
) -> float:
    """The smallest margin of another own-length rate over the variant's best (inf where none
    has scored)."""
    scored = {lr: score(rows, name(scale.tokenizer, size, variant, lr, 1)) for lr in LADDER}
    top = scored.get(best[size][variant])
    margins = [
        x - top
        for lr, x in scored.items()
        if x is not None and top is not None and lr != best[size][variant]
    ]
    return min(margins, default=math.inf)


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
    best: dict[str, dict[str, float]] = {}
    more: dict[tuple[str, str], list[float]] = {}
    for (size, variant), lrs in rates.items():
        steps = (lengths or {}).get(size)
        scored = {lr: score(rows, name(scale.tokenizer, size, variant, lr, 1, steps)) for lr in lrs}
        scored = {lr: x for lr, x in scored.items() if x is not None}
        if not scored:
            raise SystemExit(
                f"study: no finished sweep run of {variant} at size {size} ({lrs}): run the sweep"
            )
        lr = best.setdefault(size, {})[variant] = min(scored, key=scored.get)
        rung = LADDER.index(lr) if lr in LADDER else None
        for edge, neighbour in ((min(lrs), -1), (max(lrs), 1)):
            inside = rung is not None and 0 <= rung + neighbour < len(LADDER)
            if inside and lr == edge and LADDER[rung + neighbour] not in lrs:
                more.setdefault((size, variant), []).append(LADDER[rung + neighbour])
    return best, more


def score(rows: dict[str, dict], run_name: str) -> float | None:
    """The run's validation bits/byte; None when it has not run (or logged none); inf when it
    diverged."""
    row = rows.get(run_name)
    if row is None or row.get(METRIC) is None:
        return None
    return row[METRIC] if math.isfinite(row[METRIC]) else math.inf


def swept(
    scale: Scale, rows: dict[str, dict], lengths: dict[str, int] | None = None
) -> dict[tuple[str, str], list[float]]:
    """The rates each (swept size, paper variant) finished with seed 1 at the size's own length (or
    ``lengths[size]`` updates: then only the sizes it names) and codebook."""
    lengths = lengths or {}
    rates = {key: set() for key in initial_rates(scale) if not lengths or key[0] in lengths}
    for n in rows:
        if not NAME.match(n):  # a row of another plan in the file
            continue
        r = parse_name(n)
        own = (
            r["tok"] == scale.tokenizer and r["seed"] == 1 and r["steps"] == lengths.get(r["size"])
        )
        own = own and r["code"] is None
        if own and (r["size"], r["variant"]) in rates:
            rates[(r["size"], r["variant"])].add(r["lr"])
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
    steps: int,
) -> float:
    """A paper variant's rate at ``size`` trained ``steps`` updates: the resweep's best
    (``again``) where the size was swept again at a length nearer ``steps`` than its own, else
    the size's own best."""
    resweep = scale.resweep.get(size)
    if resweep and size in again and nearest_sweep(steps, [None, resweep], own_steps(scale, size)):
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
    it has whole cells. ``again``: the resweep's best rates, for the lengths nearer its length
    than the size's own."""
    steps = []
    if "sizes" in stages:
        steps += [
            step(scale, size, v, rate_at(scale, best, size, v), seed)
            for seed in seeds
            for size in scale.sizes
            for v in PAPER
        ]
    if "length" in stages:
        steps += [
            step(scale, size, v, length_rate(scale, best, again or {}, size, v, n), seed, steps=n)
            for size, lengths in scale.lengths.items()
            for n in lengths
            for v in PAPER
            for seed in seeds
        ]
    if (
        "codebooks" in stages
    ):  # seed s > 1 draws codebook s: the spread over seeds holds the codebook's
        steps += [
            step(scale, size, v, rate_at(scale, best, size, CONTROLS.get(v, v)), seed, code=seed)
            for seed in seeds
            if seed > 1
            for size, v in scale.codebooks
        ]
    if "controls" in stages:
        steps += [
            step(scale, scale.tune, c, rate_at(scale, best, scale.tune, like), seed)
            for seed in seeds
            for c, like in CONTROLS.items()
        ]
    if "smollm2" in stages and scale.tokenizer != "smollm2":
        steps += [
            step(scale, scale.tune, v, rate_at(scale, best, scale.tune, v), seed, "smollm2")
            for seed in seeds
            for v in PAPER
        ]
    return steps


# --smoke: the plan's configs, shrunk to 2 updates of tiny batches on this machine's CPU and local
# data
SMOKE = [
    "--trainer.accelerator=cpu",
    "--trainer.precision=32-true",
    "--trainer.max_steps=2",
    "--trainer.val_check_interval=2",
    "--model.schedule.warmup_steps=1",
    "--data.batch_size=1",
    "--data.seq_len=64",
    "--data.num_workers=0",
    "--data.val_sequences=9",
    "--data.train=../shared/data/gutenberg-prose/train.jsonl",
]


def smoke_plan(scale: Scale) -> list[tuple]:
    """The learned model at every size, and every other variant and control at the tuning size."""
    steps = [step(scale, size, "learned", 1e-3, 1) for size in scale.sizes]
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
        if all(
            score(rows, name(scale.tokenizer, size, v, lr, 1, lengths.get(size))) is not None
            for lr in lrs
        )
    }


def planned_rates(
    scale: Scale, rows: dict[str, dict], rates: dict[tuple[str, str], list[float]]
) -> tuple[dict, bool]:
    """The rates the later stages run at, for --estimate, and whether any is a guess: each
    (size, variant)'s best where seed 1 has scored every rate of its sweep, else the middle of
    the size's sweep."""
    best = {size: {v: lrs[len(lrs) // 2] for v in PAPER} for size, lrs in scale.sweep.items()}
    complete = fully_scored(scale, rows, rates)
    if complete:
        for size, by_variant in best_lrs(scale, rows, complete)[0].items():
            best[size].update(by_variant)
    return best, len(complete) < len(rates)
