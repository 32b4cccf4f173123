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
from experiments.report.results import GAPS, SPLITS, Study, _config, non_embedding, parse, updates
from experiments.report.stats import holm, paired, slope_fit, slope_p

ESTABLISHED, SIGN, NOT = (
    "established",
    "same sign in every seed, not established",
    "not established",
)
VOCABULARY = (
    f"A difference or slope is **{ESTABLISHED}** only where its Holm-adjusted p is below 0.05 in "
    "the declared "
    f"family; **{SIGN}** where it has the same sign in every seed (for a slope: the line through "
    "each seed's "
    f"points alone) but is not established; otherwise **{NOT}**. A 95 % interval is never "
    "corrected and never "
    "decides a word. A trend is named with everything that varied along it; no value is stated "
    "beyond the "
    "measured range."
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


def gap_label(size: str, steps_tokens: float, a: str, b: str, split: str) -> str:
    return f"{b} − {a}, {size.upper()}, {steps_tokens / 1e6:.2f}M tokens, {split}"


def differences(study: Study, tok: str) -> list[Claim]:
    """Every gap at every (size, length) at its chosen rates, both splits; every control against
    learned and binary16 at the tuning size (val)."""
    found = []
    for size in study.sizes(tok):
        for steps in study.lengths(tok, size):
            for split in SPLITS:
                for a, b in GAPS:
                    label = gap_label(size, study.tokens(tok, size, steps), a, b, split)
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
            chosen = {v: study.rate(tok, size, v, steps) for v in PAPER}
            if steps is None or None in own.values():
                continue
            for split in SPLITS:
                for a, b in GAPS:
                    if own[a] == chosen[a] and own[b] == chosen[b]:
                        continue
                    cells = _cells(study, tok, size, steps, a, b, own)
                    if all(cells):
                        label = (
                            gap_label(size, study.tokens(tok, size, steps), a, b, split)
                            + ", old rates"
                        )
                        found.append(_difference(study, label, cells, split, "old-rate difference"))
    return [c for c in found if len(c.per_seed) > 1]


def series(study: Study, tok: str) -> dict[str, tuple[list[tuple[str, int | None]], str]]:
    """The report's fits: name -> (points, x). Size at each size's own length, size at the
    largest size's tokens, and length at each size that ran more than one."""
    sizes = study.sizes(tok)
    found = {"size, each at its own length": ([(s, None) for s in sizes], "params")}
    if sizes:
        target = study.tokens(tok, sizes[-1], None)
        same = [
            (s, n)
            for s in sizes
            for n in study.lengths(tok, s)
            if study.tokens(tok, s, n) == target
        ]
        if len(same) > 1:
            found["size, at equal tokens"] = (same, "params")
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
                xs, samples, seeds, names = [], [], [], []
                for size, steps in points:
                    cells = _cells(study, tok, size, steps, a, b)
                    va, vb = (study.values(c, split) for c in cells)
                    by_seed = {
                        s: vb[s] - va[s]
                        for s in sorted(set(va) & set(vb))
                        if math.isfinite(va[s]) and math.isfinite(vb[s])
                    }
                    if not by_seed:
                        continue
                    row = study.first(tok, size, steps)
                    xs.append(non_embedding(row) if x == "params" else row["tokens_seen"])
                    samples.append(list(by_seed.values()))
                    seeds.append(by_seed)
                    names += [r["name"] for c in cells for r in c.values()]
                if len(xs) < 2:
                    continue
                slope, low, high = slope_fit(xs, samples)
                common = sorted(set.intersection(*(set(s) for s in seeds)))
                per_seed = tuple(slope_fit(xs, [[s[k]] for s in seeds])[0] for k in common)
                found.append(
                    Claim(
                        slope_label(name, a, b, split),
                        "slope",
                        slope,
                        low,
                        high,
                        slope_p(xs, samples),
                        per_seed,
                        tuple(names),
                        varied(study, tok, points, b),
                        len(xs),
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


def _decoder(study: Study, tok: str, size: str, steps: int | None) -> dict:
    return _config(study.first(tok, size, steps))["model"]["decoder"]


def varied(study: Study, tok: str, points: Sequence[tuple[str, int | None]], b: str) -> str:
    """Everything that moved along a line's points: size, tokens, tokens per parameter, width,
    depth, the length its rates were chosen at, and gf2's codebook."""
    rows = [study.first(tok, s, n) for s, n in points]
    moved = []
    params = [non_embedding(r) for r in rows]
    tokens = [r["tokens_seen"] for r in rows]
    if len(set(params)) > 1:
        moved.append(
            "size (" + ", ".join(f"{p / 1e6:.2f}M" for p in params) + " non-embedding parameters)"
        )
    if len(set(tokens)) > 1:
        moved.append("training tokens (" + ", ".join(f"{t / 1e6:.2f}M" for t in tokens) + ")")
    ratios = [f"{t / p:.2f}" for t, p in zip(tokens, params, strict=True)]
    if len(set(ratios)) > 1:
        moved.append(f"tokens per non-embedding parameter ({', '.join(ratios)})")
    decoders = [_decoder(study, tok, s, n) for s, n in points]
    for key, what in (("d_model", "width (d"), ("n_layers", "depth (blocks")):
        values = [d[key] for d in decoders]
        if len(set(values)) > 1:
            moved.append(f"{what} {', '.join(map(str, values))})")
    chosen = [study.chosen_at(tok, s, n) for s, n in points]
    at = [updates(study.first(tok, s, c)) for (s, _), c in zip(points, chosen, strict=True)]
    ran = [updates(r) for r in rows]
    if len(set(at)) > 1 or at != ran:
        moved.append(
            f"the length the rates were chosen at ({', '.join(f'{u:,}' for u in at)} updates, for "
            "runs of "
            f"{', '.join(f'{u:,}' for u in ran)})"
        )
    if b == "gf2":
        coded = [
            any(parse(r)["code"] is not None for r in study.cell(tok, s, "gf2", n).values())
            for s, n in points
        ]
        if len(set(coded)) > 1:
            moved.append(
                "gf2's codebook (one per seed at "
                + ", ".join(
                    f"{s.upper()} {updates(r):,}"
                    for (s, _), r, c in zip(points, rows, coded, strict=True)
                    if c
                )
                + "; the config's at the others)"
            )
    return "; ".join(moved)
