"""The study's claims as tests, and the word each one earns by rule (prose.py writes them
out).

Every difference and slope the report states is a :class:`Claim`: its estimate, its 95 %
interval, its p, its value in each seed, and the rows it is computed from. The words are chosen
by :func:`word` alone, from the Holm- adjusted p in the declared family (:func:`family`) and the
signs over seeds; nothing is typed by hand. The family is declared once (:data:`FAMILY`), and
:func:`sensitivity` says which claims change word when it is drawn otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from experiments.plan.names import CONTROLS, PAPER
from experiments.report.results import (
    GAPS,
    SPLITS,
    Points,
    Study,
    parse,
    run_record,
)
from experiments.report.stats import by_seed, holm, paired, slope_fit

ESTABLISHED, SIGN, NOT = (
    "established",
    "same sign in every seed, not established",
    "not established",
)
VOCABULARY = (
    f"A difference or slope is **{ESTABLISHED}** only where its Holm-adjusted p is below 0.05 in "
    f"the declared family; **{SIGN}** where it has the same sign in every seed (for a slope: the "
    f"line through each seed's points alone) but is not established; otherwise **{NOT}**. A 95 % "
    "interval is never corrected and never decides a word. A trend is named with everything "
    "that varied along it; no value is stated beyond the measured range."
)
# the declared family: every gap and control difference and every slope printed
FAMILY = (
    "differences",
    "slopes",
)
ALPHA = 0.05


@dataclass(frozen=True)
class Claim:
    """A difference (``b − a`` paired by seed) or a slope of one, with what it rests on."""

    label: str
    kind: str  # "difference" or "slope"
    estimate: float
    low: float
    high: float
    p: float
    per_seed: tuple[float, ...]
    rows: tuple[str, ...]  # the runs it is computed from (names)
    varied: str = ""  # a slope: what moved along it besides its x
    points: int = 0  # a slope: the points it joins
    runs: int = 0  # a slope: the seed-paired gaps it is fitted to
    per: str = ""  # a slope: its x ("10x parameters" or "10x training tokens")

    @property
    def signs_agree(self) -> bool:
        signs = {math.copysign(1, x) for x in self.per_seed if x != 0}
        return len(self.per_seed) > 1 and len(signs) == 1 and 0 not in self.per_seed


def word(adjusted: float, claim: Claim) -> str:
    """The rule: established only by the family's Holm p; else the signs over seeds; else not
    established."""
    if adjusted < ALPHA:  # NaN (no test) compares False
        return ESTABLISHED
    return SIGN if claim.signs_agree else NOT


def _difference(
    study: Study,
    label: str,
    split: str,
    point: tuple[str, int | None, str, str],
    lr: dict | None = None,
) -> Claim:
    """``b − a`` at ``point`` = (size, steps, a, b), paired by seed, each variant at its rate in
    ``lr`` where given (else its compared rate)."""
    size, steps, a, b = point
    cells = [study.cell(size, v, steps, lr=(lr or {}).get(v)) for v in (a, b)]
    gap = paired(*(study.values(c, split) for c in cells))
    low, high = gap.ci()
    names = tuple(row["name"] for c in cells for row in c.values())
    return Claim(label, "difference", gap.mean, low, high, gap.p, gap.diffs, names)


def gap_label(study: Study, size: str, steps: int | None, a: str, b: str, split: str) -> str:
    return f"{b} − {a}, {size.upper()}, {study.tokens(size, steps) / 1e6:.2f}M tokens, {split}"


def differences(study: Study) -> list[Claim]:
    """Every gap at every (size, length) at its chosen rates, both splits; every control against
    learned and binary16 at the tuning size (val)."""
    found = []
    for size in study.sizes:
        for steps in study.lengths(size):
            for split in SPLITS:
                for a, b in GAPS:
                    label = gap_label(study, size, steps, a, b, split)
                    found.append(_difference(study, label, split, (size, steps, a, b)))
    for v in CONTROLS:
        for ref in ("learned", "binary16"):
            label = f"{v} − {ref}, {study.tune.upper()}, val"
            found.append(_difference(study, label, "val", (study.tune, None, ref, v)))
    return [c for c in found if c.per_seed]


def old_rate_differences(study: Study) -> list[Claim]:
    """The gaps of each length that took its rates from another length's sweep, at the size's
    own-length rates (the report's "how the rates move" table): each gap one of whose variants
    ran at a rate other than its chosen one there."""
    found = []
    for size in study.sizes:
        own = {v: study.best(size, v) for v in PAPER}
        for steps in study.lengths(size):
            if steps is None or None in own.values():
                continue
            chosen = {v: study.rate(size, v, steps) for v in PAPER}
            for split in SPLITS:
                for a, b in GAPS:
                    if (own[a], own[b]) != (chosen[a], chosen[b]):
                        label = gap_label(study, size, steps, a, b, split) + ", old rates"
                        found.append(_difference(study, label, split, (size, steps, a, b), own))
    return [c for c in found if len(c.per_seed) > 1]


OWN_LENGTH, EQUAL_TOKENS = "size, each at its own length", "size, at equal tokens"


def series(study: Study) -> dict[str, tuple[Points, str]]:
    """The report's fits: name -> (points, x). Size at each size's own length, size at the
    largest size's tokens, and length at each size that ran more than one."""
    sizes = study.sizes
    found = {OWN_LENGTH: ([(s, None) for s in sizes], "params")}
    target = study.tokens(sizes[-1], None)
    same = [(s, n) for s in sizes for n in study.lengths(s) if study.tokens(s, n) == target]
    if len(same) > 1:
        found[EQUAL_TOKENS] = (same, "params")
    for s in sizes:
        if len(study.lengths(s)) > 1:
            found[f"length, at {s.upper()}"] = ([(s, n) for n in study.lengths(s)], "tokens")
    return found


def slope_label(name: str, a: str, b: str, split: str) -> str:
    return f"{b} − {a}, slope along {name}, {split}"


def slopes(study: Study) -> list[Claim]:
    """Each printed slope (binary16 − learned and gf2 − learned, both splits, every series) as a
    claim; its value per seed is the line through that seed's gaps alone."""
    found = []
    for name, (points, x) in series(study).items():
        x_of = study.params if x == "params" else study.tokens  # a point's x
        for split in SPLITS:
            for a, b in GAPS[:2]:
                xs, seeds, names = [], [], []
                for size, steps in points:
                    cells = [study.cell(size, v, steps) for v in (a, b)]
                    gaps = by_seed(*(study.values(c, split) for c in cells))
                    if gaps:
                        xs.append(x_of(size, steps))
                        seeds.append(gaps)
                        names += [r["name"] for c in cells for r in c.values()]
                if len(xs) < 2:
                    continue
                samples = [list(gaps.values()) for gaps in seeds]
                common = sorted(set.intersection(*(set(gaps) for gaps in seeds)))
                per_seed = tuple(slope_fit(xs, [[gaps[k]] for gaps in seeds])[0] for k in common)
                per = "10x parameters" if x == "params" else "10x training tokens"
                found.append(
                    Claim(
                        slope_label(name, a, b, split),
                        "slope",
                        *slope_fit(xs, samples),
                        per_seed,
                        tuple(names),
                        varied(study, points, b),
                        len(xs),
                        sum(map(len, samples)),
                        per,
                    )
                )
    return found


def family(study: Study, parts: Sequence[str] = FAMILY) -> dict[str, tuple[Claim, float]]:
    """label -> (claim, Holm p) over the claims of ``parts`` ("differences", "slopes", "old
    rates") together."""
    make = {"differences": differences, "slopes": slopes, "old rates": old_rate_differences}
    claims = [c for part in parts for c in make[part](study)]
    return {c.label: (c, p) for c, p in zip(claims, holm([c.p for c in claims]), strict=True)}


def sensitivity(study: Study) -> dict[str, list[tuple[str, str, str]]]:
    """Each other drawing of the family and the claims whose word changes there: drawing ->
    [(label, word in the declared family, word there)]. Without the slopes, a slope is
    corrected among the slopes alone."""
    declared = {label: word(p, c) for label, (c, p) in family(study).items()}
    slopes_alone = family(study, ("slopes",))
    drawings = {
        "the slopes as a family of their own, the differences as another": {
            **family(study, ("differences",)),
            **slopes_alone,
        },
        "the old-rate gaps added to the differences, the slopes a family of their own": {
            **family(study, ("differences", "old rates")),
            **slopes_alone,
        },
        "the old-rate gaps added to the declared family": family(study, (*FAMILY, "old rates")),
    }
    return {
        name: [
            (label, declared[label], word(p, c))
            for label, (c, p) in drawn.items()
            if label in declared and word(p, c) != declared[label]
        ]
        for name, drawn in drawings.items()
    }


def varied(study: Study, points: Points, b: str) -> str:
    """Everything that moved along a line's points: size, tokens, tokens per parameter, width,
    depth, the length its rates were chosen at, and gf2's codebook."""
    params, tokens = [study.params(*p) for p in points], [study.tokens(*p) for p in points]
    decoders = [run_record(study.first(*p)).config["model"]["decoder"] for p in points]
    shown = {  # each as printed: a change below the printed precision does not move it
        "size ({} non-embedding parameters)": [f"{p / 1e6:.2f}M" for p in params],
        "training tokens ({})": [f"{t / 1e6:.2f}M" for t in tokens],
        "tokens per non-embedding parameter ({})": [
            f"{t / p:.2f}" for t, p in zip(tokens, params, strict=True)
        ],
        "width (d {})": [str(d["d_model"]) for d in decoders],
        "depth (blocks {})": [str(d["n_layers"]) for d in decoders],
    }
    moved = [
        text.format(", ".join(values)) for text, values in shown.items() if len(set(values)) > 1
    ]
    at = [study.trained(s, study.chosen_at(s, n)) for s, n in points]
    ran = [study.trained(*p) for p in points]
    if len(set(at)) > 1 or at != ran:
        moved.append(
            f"the length the rates were chosen at ({', '.join(f'{u:,}' for u in at)} updates, "
            f"for runs of {', '.join(f'{u:,}' for u in ran)})"
        )
    coded = [
        (s, n)
        for s, n in points
        if any(parse(r)["code"] is not None for r in study.cell(s, "gf2", n).values())
    ]
    if b == "gf2" and 0 < len(coded) < len(points):
        where = ", ".join(f"{s.upper()} {study.trained(s, n):,}" for s, n in coded)
        moved.append(f"gf2's codebook (one per seed at {where}; the config's at the others)")
    return "; ".join(moved)
