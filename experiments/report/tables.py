"""The study report's tables of gaps and claims (render.py puts them in order; sweeps.py draws
the learning-rate sweep): the gaps by size and length with their slopes, the sizes, the codebook
spread, the controls and the paired tests.

"mean ± sd" is the sample sd over seeds; a 95 % interval is the t interval of the mean.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from experiments.plan.names import CODED, CONTROLS, LABELS, PAPER
from experiments.report.findings import (
    EQUAL_TOKENS,
    OWN_LENGTH,
    VOCABULARY,
    Claim,
    slope_label,
    word,
)
from experiments.report.results import GAPS, SPLITS, Points, Study, parse
from experiments.report.stats import Paired, paired

SCORES = [  # (column key, title, scale, decimals)
    ("gutenberg_ppl|bits_per_byte|0", "lm-eval books bits/byte", 1.0, 3),
    ("gutenberg_word_order|acc|0", "books word order acc (%)", 100.0, 1),
]
GAP_HEADS = [f"{b} − {a} ({split})" for split in SPLITS for a, b in GAPS]


def fmt(p: Paired, decimals: int = 4) -> str:
    if not p.n:
        return "--"
    if p.n == 1:
        return f"{p.mean:+.{decimals}f} (1 run)"
    return f"{p.mean:+.{decimals}f} ± {p.sd:.{decimals}f}"


def mean_sd(values: Sequence[float], scale: float = 1.0, decimals: int = 4) -> str:
    finite = [v * scale for v in values if math.isfinite(v)]
    text = fmt(Paired(tuple(finite)), decimals).lstrip("+").replace(" (1 run)", " (1)")
    return text + (
        f" ({len(values) - len(finite)} diverged or unscored)" if len(finite) < len(values) else ""
    )


def gap_cells(study: Study, size: str, steps: int | None, rates: dict[str, float | None]) -> str:
    """``lr (l/b/g) | seeds (l/b/g) | the gaps``, each variant at its rate in ``rates``."""
    cells = {v: study.cell(size, v, steps, lr=rates[v]) for v in PAPER}
    gaps = [
        fmt(paired(study.values(cells[a], split), study.values(cells[b], split)))
        for split in SPLITS
        for a, b in GAPS
    ]
    lr = "/".join("--" if rates[v] is None else f"{rates[v]:g}" for v in PAPER)
    return " | ".join([lr, "/".join(str(len(cells[v])) for v in PAPER), *gaps])


def gap_table(study: Study, points: Points) -> list[str]:
    """A row per (size, steps): the three paired gaps on both splits."""
    lines = [
        "| size | non-emb. params | updates | tokens / non-emb. param | lr (l/b/g) | "
        "seeds (l/b/g) | " + " | ".join(GAP_HEADS) + " |",
        "|---|---:|---:|---:|---|---:|" + "---:|" * len(GAP_HEADS),
    ]
    for size, steps in points:
        rates = {v: study.rate(size, v, steps) for v in PAPER}
        lines.append(
            f"| {size.upper()} | {study.params(size, steps):,} | {study.trained(size, steps):,} | "
            f"{study.per_param(size, steps):.2f} | "
            f"{gap_cells(study, size, steps, rates)} |"
        )
    return lines


def _said(claim: Claim, adjusted: float) -> str:
    """``; Holm p 0.0405: established``: the claim's word in the family."""
    holm_p = "" if math.isnan(adjusted) else f"Holm p {adjusted:.3g}: "
    return f"; {holm_p}{word(adjusted, claim)}"


def fit_lines(claims: dict, name: str) -> list[str]:
    """The slope of each gap along the series ``name`` (findings.series) per decade of its x,
    with its interval, its Holm p and its word in ``claims`` (findings.family)."""
    lines = []
    for split in SPLITS:
        for a, b in GAPS[:2]:
            if (label := slope_label(name, a, b, split)) in claims:
                c, adjusted = claims[label]
                spread = _interval(c, 4, "no interval: a point has one seed")
                lines.append(
                    f"- {b} − {a} ({split}): {c.estimate:+.4f} bits/byte per {c.per} ({spread}; "
                    f"{c.points} points, {c.runs} runs){_said(c, adjusted)}"
                )
    return lines


def _interval(claim: Claim, decimals: int, none: str) -> str:
    """``95 % low to high``, or ``none`` where a point has one seed."""
    if math.isnan(claim.low):
        return none
    return f"95 % {claim.low:+.{decimals}f} to {claim.high:+.{decimals}f}"


def design_lines(claims: dict) -> list[str]:
    """Each gap's size slope at equal tokens per parameter and at equal tokens (the series
    findings.OWN_LENGTH and EQUAL_TOKENS), side by side, each with its word."""
    lines = []
    for split in SPLITS:
        for a, b in GAPS[:2]:
            labels = [slope_label(name, a, b, split) for name in (OWN_LENGTH, EQUAL_TOKENS)]
            if not all(label in claims for label in labels):
                continue
            text = [
                f"{c.estimate:+.3f} ({_interval(c, 3, 'no interval')}{_said(c, adjusted)})"
                for c, adjusted in map(claims.get, labels)
            ]
            lines.append(
                f"- {b} − {a} ({split}): {text[0]} at equal tokens per parameter; {text[1]} at "
                "equal tokens"
            )
    return lines


def size_table(study: Study) -> list[str]:
    header = [
        "size",
        "variant",
        "lr",
        "seeds",
        "trainable params",
        "targets",
        *SPLITS.values(),
        *[t for _, t, _, _ in SCORES],
        "wall / run (min)",
    ]
    lines = ["| " + " | ".join(header) + " |", "|---|---|" + "---:|" * (len(header) - 2)]
    for size in study.sizes:
        for v in PAPER:
            runs = list(study.cell(size, v).values())
            if not runs:
                continue
            scores = [
                mean_sd(
                    [r["scores"][key]["value"] for r in runs if key in r.get("scores", {})],
                    scale,
                    decimals,
                )
                for key, _, scale, decimals in SCORES
            ]
            splits = [mean_sd([study.value(r, split) for r in runs]) for split in SPLITS]
            # a resumed run's wall is partial
            whole = [r["wall_seconds"] for r in runs if not r.get("resumed")]
            wall = f"{statistics.mean(whole) / 60:.1f}" if whole else "--"
            lines.append(
                f"| {size.upper()} | {v} | {study.rate(size, v):g} | {len(runs)} | "
                f"{runs[0]['trainable_params']:,} | {runs[0]['tokens_seen'] / 1e6:.2f}M | "
                f"{' | '.join([*splits, *scores])} | {wall} |"
            )
    return lines


def codebook_lines(study: Study) -> list[str]:
    """Where a codebook was drawn per seed: each seed's value with the config's codebook and
    with its own."""
    lines = []
    for v in CODED:
        for size in study.sizes:
            one, each = study.cell(size, v, fold=False), study.cell(size, v)
            drawn = {s: r for s, r in each.items() if parse(r)["code"] is not None}
            if not drawn:
                continue
            for split in SPLITS:
                lines.append(
                    f"| {size.upper()} | {v} | {split} | "
                    f"{mean_sd([study.value(r, split) for r in one.values()])}"
                    f" | {mean_sd([study.value(r, split) for r in each.values()])} | "
                    + ", ".join(f"{s}: {study.value(r, split):.4f}" for s, r in drawn.items())
                    + f" | {fmt(study.gap(size, 'learned', v, split))} |"
                )
    if not lines:
        return []
    return [
        "## Codebook variance",
        "",
        "Seed s > 1 of a drawn code also ran with code_seed s, at each size's own length only: the "
        "spread over seeds with one codebook (the config's, every seed) against one codebook per "
        "seed (seed 1 keeps the config's). The gaps at a size's own length use the second; the "
        "training-length and equal-token runs use the first (each table says which).",
        "",
        "| size | variant | split | one codebook, mean ± sd | a codebook per seed | the drawn "
        "codebooks (seed: value) | gap to learned, a codebook per seed |",
        "|---|---|---|---:|---:|---|---:|",
        *lines,
        "",
    ]


def control_lines(study: Study, claims: dict) -> list[str]:
    """A row per control at the tuning size; each difference led by its Holm p in ``claims``
    (findings.family)."""
    size = study.tune
    lines = [
        f"| variant (size {size.upper()}) | lr | seeds | trainable params | val bits/byte | − "
        "learned: Holm p; mean ± sd (95 % CI) | − binary16: Holm p; mean ± sd (95 % CI) | "
        "position: learned 0, binary16 1 (95 % CI) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for v in CONTROLS:
        if not (cell := study.cell(size, v)):
            continue
        cols = []
        for ref in ("learned", "binary16"):
            c, adjusted = claims.get(f"{v} − {ref}, {size.upper()}, val", (None, math.nan))
            p = Paired(c.per_seed if c else ())
            holm_p = "--" if math.isnan(adjusted) else f"{adjusted:.3g}"
            cols.append(f"{holm_p}; {fmt(p)}{_ci(p, 3)}")
        share = study.position(size, v)
        where = f"{share.mean:.2f}{_ci(share, 2, '')}" if share.n else "--"
        lines.append(
            f"| {v}: {LABELS[v]} | {study.rate(size, v):g} | {len(cell)} | "
            f"{next(iter(cell.values()))['trainable_params']:,} | "
            f"{mean_sd(list(study.values(cell, 'val').values()))} | {cols[0]} | {cols[1]} | "
            f"{where} |"
        )
    return lines


def _ci(p: Paired, decimals: int, sign: str = "+") -> str:
    """`` (low, high)``, the 95 % interval; nothing where one seed gives none."""
    low, high = p.ci()
    return "" if math.isnan(low) else f" ({low:{sign}.{decimals}f}, {high:{sign}.{decimals}f})"


def test_lines(claims: dict) -> list[str]:
    """The declared family (findings.family: label -> (claim, Holm p)), every test with
    its word."""
    tested = {label: cp for label, cp in claims.items() if not math.isnan(cp[1])}
    kinds = [c.kind for c, _ in tested.values()]
    lines = [
        "## Paired tests and slopes: the family",
        "",
        VOCABULARY,
        "",
        f"{len(tested)} tests in one family, corrected together (Holm): "
        f"{kinds.count('difference')} two-sided paired t-tests over seeds (every gap and control "
        f"above with 2 or more seeds that differ) and {kinds.count('slope')} slopes (every slope "
        "above; t with the interval's degrees of freedom). With 3 seeds a paired test has 2 "
        "degrees of freedom.",
        "",
        "| test | seeds | estimate | 95 % CI | p | p (Holm) | word |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for label, (c, adj) in tested.items():
        lines.append(
            f"| {label} | {len(c.per_seed)} | {c.estimate:+.4f} | {c.low:+.4f}, {c.high:+.4f} | "
            f"{c.p:.3g} | {adj:.3g} | {word(adj, c)} |"
        )
    return lines


def codebook_note(study: Study, points: Points) -> str:
    """Which of the points' gf2 cells use a codebook per seed and which the config's at every
    seed, and how far the per-seed codebooks move gf2's mean from the config's."""
    per_seed, one = [], []
    for size, steps in points:
        if not (cell := study.cell(size, "gf2", steps)):
            continue
        where = f"{size.upper()} at {study.trained(size, steps):,} updates"
        if any(parse(r)["code"] is not None for r in cell.values()):
            config = study.cell(size, "gf2", steps, fold=False)
            moved = ", ".join(
                f"{study.finite(cell, split).mean - study.finite(config, split).mean:+.4f} {split}"
                for split in SPLITS
            )
            per_seed.append(f"{where} (against the config's at every seed: {moved})")
        else:
            one.append(where)
    parts = [f"one per seed at {'; '.join(per_seed)}"] if per_seed else []
    if one:
        parts.append(
            f"the config's at every seed at {', '.join(one)} (no codebook per seed ran there)"
        )
    return f"gf2's GF(2) matrix: {'; '.join(parts)}." if parts else ""
