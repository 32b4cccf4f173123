"""The study report's account of its learning rates (render.py puts it in order): each sweep
with its margins against the seed noise, the near-ties, which sweep chose the rates of each
training length, and how the rates swept at another length move the gaps."""

from __future__ import annotations

import math

import numpy as np

from experiments.plan.names import PAPER
from experiments.report.results import Study
from experiments.report.tables import GAP_HEADS, gap_cells


def sweep_lines(study: Study) -> list[str]:
    lines = [
        "## The learning-rate sweep (seed 1, validation bits/byte)",
        "",
        "Each size is swept on its own; a variant whose best rate was at the edge of its rates got "
        "the next rung. The best rate (bold) is the one the later stages use at that size; a size "
        "swept again at another length gives its best to the runs nearer that length in log "
        "updates. In brackets each rate's margin over the best, against the seed sd: the sd over "
        "seeds of the variant at its best rate there (or, where that has one seed, at its rate "
        "with the most seeds), or at the rate itself where that ran more seeds and varies more; a "
        "margin below it is a near-tie that one seed cannot order. Where more seeds ran at two "
        "rates, their paired differences follow the table.",
        "",
    ]
    for size in study.sizes:
        for steps in study.sweeps(size):
            lines += _sweep_table(study, size, steps)
    return lines


def _sweep_table(study: Study, size: str, steps: int | None) -> list[str]:
    lrs = sorted({lr for v in PAPER for lr in study.swept(size, v, steps)})
    uses = [
        f"{study.trained(size, n):,}"
        for n in study.lengths(size)
        if study.chosen_at(size, n) == steps
    ]
    lines = [
        f"Size {size.upper()}, {study.trained(size, steps):,} updates (its rates serve the "
        f"runs of {', '.join(uses)} updates):",
        "",
        "| variant | "
        + " | ".join(f"{lr:g}" for lr in lrs)
        + " | best | seed sd (seeds, at rate) |",
        "|---|" + "---:|" * (len(lrs) + 2),
    ]
    for v in PAPER:
        scored, best = study.swept(size, v, steps), study.best(size, v, steps)
        spread, at = study.spread(size, v, steps)
        cells = [
            "--"
            if lr not in scored
            else f"**{scored[lr]:.4f}**"
            if lr == best
            else f"{scored[lr]:.4f} ({scored[lr] - scored[best]:+.4f})"
            for lr in lrs
        ]
        sd = "--" if math.isnan(spread.sd) else f"{spread.sd:.4f} ({spread.n}, {at:g})"
        lines.append(
            f"| {v} | {' | '.join(cells)} | {'--' if best is None else f'{best:g}'} | {sd} |"
        )
    ties, seeded = near_ties(study, size, steps), seeded_margins(study, size, steps)
    lines += [
        "",
        f"Near-ties with the best: {'; '.join(ties)}." if ties else "No near-tie with the best.",
        "",
    ]
    if seeded:
        lines += [
            "Rates run at more than one seed, paired by seed against the best (mean ± sd; 95 % "
            "interval): " + "; ".join(seeded) + ".",
            "",
        ]
    return lines


def seeded_margins(study: Study, size: str, steps: int | None) -> list[str]:
    """Each rate with two or more seeds beside the best, as its paired difference over seeds
    from the best: where seed 1 ordered two rates that more seeds also ran, what those seeds say
    of the order."""
    found = []
    for v in PAPER:
        best = study.best(size, v, steps)
        for lr in sorted(study.swept(size, v, steps)):
            diff = study.against_best(size, v, steps, lr)
            if lr != best and diff.n > 1:
                low, high = diff.ci()
                found.append(
                    f"{v} {lr:g} − {best:g} {diff.mean:+.4f} ± {diff.sd:.4f} ({diff.n} seeds; "
                    f"{low:+.4f} to {high:+.4f})"
                )
    return found


def near_ties(study: Study, size: str, steps: int | None) -> list[str]:
    """The rates of a sweep within one seed sd of their variant's best: the sd over seeds at the
    best rate, or at the rate itself where that ran more seeds and varies more (a rate that is
    unstable over seeds ties more)."""
    ties = []
    for v in PAPER:
        scored, best = study.swept(size, v, steps), study.best(size, v, steps)
        at_best = study.spread(size, v, steps)[0].sd
        for lr, x in sorted(scored.items()):
            own = study.finite(study.cell(size, v, steps, fold=False, lr=lr), "val").sd
            sd = np.fmax(at_best, own)  # NaN where neither has 2 seeds
            if lr != best and x - scored[best] < sd:
                ties.append(f"{v} {lr:g} (+{x - scored[best]:.4f} against {sd:.4f})")
    return ties


def rates_note(study: Study, size: str) -> str:
    """Which sweep chose the rates of each of the size's lengths, the near-ties in those sweeps,
    and the variants not yet run at their chosen rate."""
    if not study.sweeps(size):
        return ""
    used: dict[int | None, list[int | None]] = {}  # sweep -> the lengths that took its rates
    for n in study.lengths(size):
        used.setdefault(study.chosen_at(size, n), []).append(n)

    def count(n: int | None) -> str:
        return f"{study.trained(size, n):,}"

    parts = [
        f"its sweep at {count(s)} updates for {', '.join(map(count, ns))}" for s, ns in used.items()
    ]
    text = f"{size.upper()}'s rates: {'; '.join(parts)} updates (the sweep nearest in log updates)."
    if any(n != sweep for sweep, ns in used.items() for n in ns):
        ties = [t for sweep in used for t in near_ties(study, size, sweep)]
        text += (
            " A slope across these lengths joins points whose rates were chosen at another length, "
            "each only as sure as its sweep's margins"
            + (f" (near-ties: {'; '.join(ties)})." if ties else ".")
        )
    stale = []
    for n in study.lengths(size):
        for v in PAPER:
            chosen = study.best(size, v, study.chosen_at(size, n))
            ran = study.rate(size, v, n)
            if None not in (chosen, ran) and ran != chosen:  # one never run there shows "--"
                stale.append(f"{v} at {count(n)} updates ({ran:g}, not {chosen:g})")
    if stale:
        text += (
            f" Not yet run at the chosen rate, so shown at the rate they ran: {'; '.join(stale)}."
        )
    return text


def moved_lines(study: Study, size: str) -> list[str]:
    """Each length whose rates came from a sweep at another length than the size's own: its gaps
    at the own-length sweep's rates beside those at the chosen sweep's (the seeds each has run),
    so the move is read where it is."""
    own = {v: study.best(size, v) for v in PAPER}
    rows = []
    for n in study.lengths(size):
        sweep = study.chosen_at(size, n)
        chosen = {v: study.best(size, v, sweep) for v in PAPER}
        if sweep is None or None in (*chosen.values(), *own.values()) or chosen == own:
            continue
        for label, rates in ((study.trained(size, None), own), (sweep, chosen)):
            cells = gap_cells(study, size, n, rates)
            rows.append(f"| {study.trained(size, n):,} | {label:,} | {cells} |")
    if not rows:
        return []
    return [
        f"How the rates swept at another length move {size.upper()}'s gaps (each at the seeds it "
        "ran):",
        "",
        "| updates | rates swept at (updates) | lr (l/b/g) | seeds (l/b/g) | "
        + " | ".join(GAP_HEADS)
        + " |",
        "|---:|---:|---|---:|" + "---:|" * len(GAP_HEADS),
        *rows,
        "",
    ]
