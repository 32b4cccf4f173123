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
    _config,
    non_embedding,
    parse,
    updates,
)
from experiments.report.stats import by_seed, holm, paired, slope_fit, slope_p

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
FAMILY = (
    "differences",
    "slopes",
)  # the declared family: every gap and control difference and every slope printed
ALPHA = 0.05


@dataclass(frozen=True)
class Claim:
    """A difference (``b − a`` paired by seed) or a slope of one, with what it rests on."""

    label: str
    kind: str  # "difference", "slope" or "old-rate difference"
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


def _cells(
    study: Study, tok: str, size: str, steps: int | None, a: str, b: str, lr: dict | None = None
):
    lr = lr or {}
    return [study.cell(tok, size, v, steps, lr=lr.get(v)) for v in (a, b)]


def _difference(
    study: Study, label: str, cells: list, split: str, kind: str = "difference"
) -> Claim:
    gap = paired(*(study.values(c, split) for c in cells))
    low, high = gap.ci()
    names = tuple(row["name"] for c in cells for row in c.values())
    return Claim(label, kind, gap.mean, low, high, gap.p, gap.diffs, names)


def gap_label(
    study: Study, tok: str, size: str, steps: int | None, a: str, b: str, split: str
) -> str:
    return f"{b} − {a}, {size.upper()}, {study.tokens(tok, size, steps) / 1e6:.2f}M tokens, {split}"


def differences(study: Study, tok: str) -> list[Claim]:
    """Every gap at every (size, length) at its chosen rates, both splits; every control against
    learned and binary16 at the tuning size (val)."""
    found = []
    for size in study.sizes(tok):
        for steps in study.lengths(tok, size):
            for split in SPLITS:
                for a, b in GAPS:
                    label = gap_label(study, tok, size, steps, a, b, split)
                    found.append(
                        _difference(study, label, _cells(study, tok, size, steps, a, b), split)
                    )
    for v in CONTROLS:
        for ref in ("learned", "binary16"):
            cells = _cells(study, tok, study.tune, None, ref, v)
            if cells[1]:
                found.append(
                    _difference(study, f"{v} − {ref}, {study.tune.upper()}, val", cells, "val")
                )
    return [c for c in found if c.per_seed]


def old_rate_differences(study: Study, tok: str) -> list[Claim]:
    """The gaps of each length that took its rates from another length's sweep, at the size's
    own-length rates (the report's "how the rates move" table): each gap one of whose variants
    ran at a rate other than its chosen one there."""
    found = []
    for size in study.sizes(tok):
        own = {v: study.best(tok, size, v) for v in PAPER}
        for steps in study.lengths(tok, size):
            if steps is None or None in own.values():
                continue
            chosen = {v: study.rate(tok, size, v, steps) for v in PAPER}
            for split in SPLITS:
                for a, b in GAPS:
                    if (own[a], own[b]) == (chosen[a], chosen[b]):
                        continue
                    if all(cells := _cells(study, tok, size, steps, a, b, own)):
                        label = gap_label(study, tok, size, steps, a, b, split) + ", old rates"
                        found.append(_difference(study, label, cells, split, "old-rate difference"))
    return [c for c in found if len(c.per_seed) > 1]


OWN_LENGTH, EQUAL_TOKENS = "size, each at its own length", "size, at equal tokens"


def series(study: Study, tok: str) -> dict[str, tuple[Points, str]]:
    """The report's fits: name -> (points, x). Size at each size's own length, size at the
    largest size's tokens, and length at each size that ran more than one."""
    sizes = study.sizes(tok)
    found = {OWN_LENGTH: ([(s, None) for s in sizes], "params")}
    if sizes:
        target = study.tokens(tok, sizes[-1], None)
        same = [
            (s, n)
            for s in sizes
            for n in study.lengths(tok, s)
            if study.tokens(tok, s, n) == target
        ]
        if len(same) > 1:
            found[EQUAL_TOKENS] = (same, "params")
    for s in sizes:
        if len(study.lengths(tok, s)) > 1:
            found[f"length, at {s.upper()}"] = ([(s, n) for n in study.lengths(tok, s)], "tokens")
    return found


def slope_label(name: str, a: str, b: str, split: str) -> str:
    return f"{b} − {a}, slope along {name}, {split}"


def slopes(study: Study, tok: str) -> list[Claim]:
    """Each printed slope (binary16 − learned and gf2 − learned, both splits, every series) as a
    claim; its value per seed is the line through that seed's gaps alone."""
    found = []
    for name, (points, x) in series(study, tok).items():
        for split in SPLITS:
            for a, b in GAPS[:2]:
                xs, seeds, names = [], [], []
                for size, steps in points:
                    cells = _cells(study, tok, size, steps, a, b)
                    gaps = by_seed(*(study.values(c, split) for c in cells))
                    if gaps:
                        row = study.first(tok, size, steps)
                        xs.append(non_embedding(row) if x == "params" else row["tokens_seen"])
                        seeds.append(gaps)
                        names += [r["name"] for c in cells for r in c.values()]
                if len(xs) < 2:
                    continue
                samples = [list(gaps.values()) for gaps in seeds]
                common = sorted(set.intersection(*(set(gaps) for gaps in seeds)))
                per_seed = tuple(slope_fit(xs, [[gaps[k]] for gaps in seeds])[0] for k in common)
                label, moved = slope_label(name, a, b, split), varied(study, tok, points, b)
                per = "10x parameters" if x == "params" else "10x training tokens"
                fit = slope_fit(xs, samples)
                found.append(
                    Claim(
                        label,
                        "slope",
                        *fit,
                        slope_p(xs, samples),
                        per_seed,
                        tuple(names),
                        moved,
                        len(xs),
                        sum(map(len, samples)),
                        per,
                    )
                )
    return found


def family(study: Study, tok: str, parts: Sequence[str] = FAMILY) -> dict[str, tuple[Claim, float]]:
    """label -> (claim, Holm p) over the claims of ``parts`` ("differences", "slopes", "old
    rates") together."""
    make = {"differences": differences, "slopes": slopes, "old rates": old_rate_differences}
    claims = [c for part in parts for c in make[part](study, tok)]
    return {c.label: (c, p) for c, p in zip(claims, holm([c.p for c in claims]), strict=True)}


def sensitivity(study: Study, tok: str) -> list[tuple[str, list[tuple[str, str, str]]]]:
    """Each other drawing of the family and the claims whose word changes there: (drawing,
    [(label, word in the declared family, word there)]). Without the slopes, a slope is
    corrected among the slopes alone."""
    declared = {label: word(p, c) for label, (c, p) in family(study, tok).items()}
    slopes_alone = family(study, tok, ("slopes",))
    drawings = {
        "the slopes as a family of their own, the differences as another": {
            **family(study, tok, ("differences",)),
            **slopes_alone,
        },
        "the old-rate gaps added to the differences, the slopes a family of their own": {
            **family(study, tok, ("differences", "old rates")),
            **slopes_alone,
        },
        "the old-rate gaps added to the declared family": family(
            study, tok, (*FAMILY, "old rates")
        ),
    }
    found = []
    for name, drawn in drawings.items():
        moved = [
            (label, declared[label], word(p, c))
            for label, (c, p) in drawn.items()
            if label in declared and word(p, c) != declared[label]
        ]
        found.append((name, moved))
    return found


def varied(study: Study, tok: str, points: Points, b: str) -> str:
    """Everything that moved along a line's points: size, tokens, tokens per parameter, width,
    depth, the length its rates were chosen at, and gf2's codebook."""
    rows = [study.first(tok, s, n) for s, n in points]
    params, tokens = [non_embedding(r) for r in rows], [r["tokens_seen"] for r in rows]
    decoders = [_config(r)["model"]["decoder"] for r in rows]
    moved = []
    for text, values, show in (
        ("size ({} non-embedding parameters)", params, lambda p: f"{p / 1e6:.2f}M"),
        ("training tokens ({})", tokens, lambda t: f"{t / 1e6:.2f}M"),
        (
            "tokens per non-embedding parameter ({})",
            [f"{t / p:.2f}" for t, p in zip(tokens, params, strict=True)],
            str,
        ),
        ("width (d {})", [d["d_model"] for d in decoders], str),
        ("depth (blocks {})", [d["n_layers"] for d in decoders], str),
    ):
        if len(set(values)) > 1:
            moved.append(text.format(", ".join(map(show, values))))
    at = [study.trained(tok, s, study.chosen_at(tok, s, n)) for s, n in points]
    ran = [updates(r) for r in rows]
    if len(set(at)) > 1 or at != ran:
        moved.append(
            f"the length the rates were chosen at ({', '.join(f'{u:,}' for u in at)} updates, "
            f"for runs of {', '.join(f'{u:,}' for u in ran)})"
        )
    coded = [
        (s, r)
        for (s, n), r in zip(points, rows, strict=True)
        if any(parse(x)["code"] is not None for x in study.cell(tok, s, "gf2", n).values())
    ]
    if b == "gf2" and 0 < len(coded) < len(points):
        where = ", ".join(f"{s.upper()} {updates(r):,}" for s, r in coded)
        moved.append(f"gf2's codebook (one per seed at {where}; the config's at the others)")
    return "; ".join(moved)
