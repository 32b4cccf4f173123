"""The study report's tables (render.py puts them in order): the sweep, the gaps by size and
length with their slopes, the codebook spread, the controls and the paired tests.

"mean ± sd" is the sample sd over seeds; a 95 % interval is the t interval of the mean.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from experiments.plan.names import CODED, CONTROLS, LABELS, PAPER
from experiments.report.findings import VOCABULARY, slope_label, word
from experiments.report.results import GAPS, SPLITS, Study, non_embedding, parse, updates
from experiments.report.stats import Paired, paired, slope_fit

SCORES = [  # (column key, title, scale, decimals)
    ("gutenberg_ppl|bits_per_byte|0", "lm-eval books bits/byte", 1.0, 3),
    ("gutenberg_word_order|acc|0", "books word order acc (%)", 100.0, 1),
]


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


def _cells(
    study: Study, tok: str, size: str, variants: Sequence[str], steps: int | None = None
) -> str:
    rates = [study.rate(tok, size, v, steps) for v in variants]
    return "/".join("--" if lr is None else f"{lr:g}" for lr in rates)


def sweep_lines(study: Study, tok: str, sizes: Sequence[str]) -> list[str]:
    lines = [
        "## The learning-rate sweep (seed 1, validation bits/byte)",
        "",
        "Each size is swept on its own; a variant whose best rate was at the edge of its rates got "
        "the next "
        "rung. The best rate (bold) is the one the later stages use at that size; a size swept "
        "again at "
        "another length gives its best to the runs nearer that length in log updates. In brackets "
        "each "
        "rate's margin over the best, against the seed sd: the sd over seeds of the variant at its "
        "best rate "
        "there (or, where that has one seed, at its rate with the most seeds), or at the rate "
        "itself where that "
        "ran more seeds and varies more; a margin below it is a near-tie that one seed cannot "
        "order. Where "
        "more seeds ran at two rates, their paired differences follow the table.",
        "",
    ]
    for size in sizes:
        for steps in study.sweeps(tok, size):
            lines += _sweep_table(study, tok, size, steps)
    return lines


def _sweep_table(study: Study, tok: str, size: str, steps: int | None) -> list[str]:
    lrs = sorted({lr for v in PAPER for lr in study.swept(tok, size, v, steps)})
    length = f"{updates(study.first(tok, size, steps)):,} updates"
    uses = [
        f"{updates(study.first(tok, size, n)):,}"
        for n in study.lengths(tok, size)
        if study.chosen_at(tok, size, n) == steps
    ]
    lines = [
        f"Size {size.upper()}, {length} (its rates serve the runs of {', '.join(uses)} updates):",
        "",
        "| variant | "
        + " | ".join(f"{lr:g}" for lr in lrs)
        + " | best | seed sd (seeds, at rate) |",
        "|---|" + "---:|" * (len(lrs) + 2),
    ]
    for v in PAPER:
        scored, best = study.swept(tok, size, v, steps), study.best(tok, size, v, steps)
        spread, at = study.spread(tok, size, v, steps)
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
            f"| {v} | " + " | ".join(cells) + f" | {'--' if best is None else f'{best:g}'} | {sd} |"
        )
    ties, seeded = near_ties(study, tok, size, steps), seeded_margins(study, tok, size, steps)
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


def seeded_margins(study: Study, tok: str, size: str, steps: int | None) -> list[str]:
    """Each rate with two or more seeds beside the best, as its paired difference over seeds
    from the best: where seed 1 ordered two rates that more seeds also ran, what those seeds say
    of the order."""
    found = []
    for v in PAPER:
        best = study.best(tok, size, v, steps)
        for lr in sorted(study.swept(tok, size, v, steps)):
            diff = study.against_best(tok, size, v, steps, lr)
            if lr != best and diff.n > 1:
                low, high = diff.ci()
                found.append(
                    f"{v} {lr:g} − {best:g} {diff.mean:+.4f} ± {diff.sd:.4f} ({diff.n} seeds; "
                    f"{low:+.4f} to {high:+.4f})"
                )
    return found


def near_ties(
    study: Study, tok: str, size: str, steps: int | None, variants: Sequence[str] = PAPER
) -> list[str]:
    """The rates of a sweep within one seed sd of their variant's best: the sd over seeds at the
    best rate, or at the rate itself where that ran more seeds and varies more (a rate that is
    unstable over seeds ties more)."""
    ties = []
    for v in variants:
        scored, best = study.swept(tok, size, v, steps), study.best(tok, size, v, steps)
        at_best = study.spread(tok, size, v, steps)[0].sd
        for lr, x in sorted(scored.items()):
            own = study.values(study.cell(tok, size, v, steps, fold=False, lr=lr), "val").values()
            sd = max(at_best, Paired(tuple(y for y in own if math.isfinite(y))).sd, key=_nan_last)
            if lr != best and x - scored[best] < sd:
                ties.append(f"{v} {lr:g} (+{x - scored[best]:.4f} against {sd:.4f})")
    return ties


def _nan_last(sd: float) -> float:
    return -math.inf if math.isnan(sd) else sd


def rates_note(study: Study, tok: str, size: str) -> str:
    """Which sweep chose the rates of each of the size's lengths, and the near-ties in those
    sweeps."""
    used: dict[int | None, list[int | None]] = {}
    for n in study.lengths(tok, size):
        used.setdefault(study.chosen_at(tok, size, n), []).append(n)
    sweeps = [sweep for sweep in used if sweep in study.sweeps(tok, size)]
    if not sweeps:
        return ""

    def count(n: int | None) -> str:
        return f"{updates(study.first(tok, size, n)):,}"

    parts = [
        f"its sweep at {count(sweep)} updates for {', '.join(map(count, used[sweep]))}"
        for sweep in sweeps
    ]
    text = (
        f"{size.upper()}'s rates: "
        + "; ".join(parts)
        + " updates (the sweep nearest in log updates)."
    )
    if any(n != sweep for sweep in sweeps for n in used[sweep]):
        ties = [t for sweep in sweeps for t in near_ties(study, tok, size, sweep)]
        text += (
            " A slope across these lengths joins points whose rates were chosen at another "
            "length, each only "
        )
        text += "as sure as its sweep's margins" + (
            f" (near-ties: {'; '.join(ties)})." if ties else "."
        )
    stale = []
    for n in study.lengths(tok, size):
        for v in PAPER:
            chosen, ran = (
                study.best(tok, size, v, study.chosen_at(tok, size, n)),
                study.rate(tok, size, v, n),
            )
            if (
                None not in (chosen, ran) and ran != chosen
            ):  # a variant that never ran there shows "--"
                stale.append(f"{v} at {count(n)} updates ({ran:g}, not {chosen:g})")
    if stale:
        text += (
            f" Not yet run at the chosen rate, so shown at the rate they ran: {'; '.join(stale)}."
        )
    return text


def gap_table(
    study: Study, tok: str, points: Sequence[tuple[str, int | None]], first: str
) -> list[str]:
    """A row per (size, steps): the three paired gaps on both splits."""
    head = [f"{b} − {a} ({split})" for split in SPLITS for a, b in GAPS]
    lines = [
        f"| {first} | non-emb. params | updates | tokens / non-emb. param | lr (l/b/g) | seeds "
        "(l/b/g) | " + " | ".join(head) + " |",
        "|---|---:|---:|---:|---|---:|" + "---:|" * len(head),
    ]
    for size, steps in points:
        row = study.first(tok, size, steps)
        seeds = "/".join(str(len(study.cell(tok, size, v, steps))) for v in PAPER)
        gaps = [fmt(study.gap(tok, size, a, b, split, steps)) for split in SPLITS for a, b in GAPS]
        lines.append(
            f"| {size.upper()} | {non_embedding(row):,} | {updates(row):,} | "
            f"{row['tokens_seen'] / non_embedding(row):.2f} | "
            f"{_cells(study, tok, size, PAPER, steps)} | "
            f"{seeds} | " + " | ".join(gaps) + " |"
        )
    return lines


def fit_lines(
    study: Study,
    tok: str,
    points: Sequence[tuple[str, int | None]],
    x: str,
    name: str = "",
    claims: dict | None = None,
) -> list[str]:
    """The slope of each gap per decade of ``x`` (non-embedding parameters or tokens), with its
    interval, and, where ``claims`` (findings.family) holds the series ``name``, its Holm
    p and word."""
    lines = []
    for split in SPLITS:
        for a, b in GAPS[:2]:
            xs, samples = _points(study, tok, points, a, b, split, x)
            if len(xs) < 2:
                continue
            slope, low, high = slope_fit(xs, samples)
            unit = "10x parameters" if x == "params" else "10x training tokens"
            spread = (
                "no interval: a point has one seed"
                if math.isnan(low)
                else f"95 % {low:+.4f} to {high:+.4f}"
            )
            lines.append(
                f"- {b} − {a} ({split}): {slope:+.4f} bits/byte per {unit} ({spread}; {len(xs)} "
                "points, "
                f"{sum(map(len, samples))} runs){_said(claims, slope_label(name, a, b, split))}"
            )
    return lines


def _said(claims: dict | None, label: str) -> str:
    """``; Holm p 0.0405: established`` for a claim of the family, nothing for one outside it."""
    if not claims or label not in claims:
        return ""
    claim, adjusted = claims[label]
    holm_p = "" if math.isnan(adjusted) else f"Holm p {adjusted:.3g}: "
    return f"; {holm_p}{word(adjusted, claim)}"


def size_table(study: Study, tok: str, sizes: Sequence[str]) -> list[str]:
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
    for size in sizes:
        for v in PAPER:
            runs = list(study.cell(tok, size, v).values())
            if not runs:
                continue
            cells = [
                size.upper(),
                v,
                f"{study.rate(tok, size, v):g}",
                str(len(runs)),
                f"{runs[0]['trainable_params']:,}",
                f"{runs[0]['tokens_seen'] / 1e6:.2f}M",
                *[mean_sd([study.value(r, split) for r in runs]) for split in SPLITS],
            ]
            for key, _, scale, decimals in SCORES:
                cells.append(
                    mean_sd(
                        [r["scores"][key]["value"] for r in runs if key in r.get("scores", {})],
                        scale,
                        decimals,
                    )
                )
            whole = [
                r["wall_seconds"] for r in runs if not r.get("resumed")
            ]  # a resumed run's wall is partial
            cells.append(f"{statistics.mean(whole) / 60:.1f}" if whole else "--")
            lines.append("| " + " | ".join(cells) + " |")
    return lines


def codebook_lines(study: Study, tok: str) -> list[str]:
    """Where a codebook was drawn per seed: each seed's value with the config's codebook and
    with its own."""
    lines = []
    for (t, size, v, steps), by_lr in study.index.items():
        lr = study.rate(tok, size, v, steps)
        if t != tok or v not in CODED or steps is not None or lr not in by_lr:
            continue
        seeds = by_lr[lr]
        drawn = {s: codes[s] for s, codes in seeds.items() if s in codes}
        if not drawn:
            continue
        one = study.cell(tok, size, v, fold=False)
        each = study.cell(tok, size, v)
        for split in SPLITS:
            lines.append(
                f"| {size.upper()} | {v} | {split} | "
                f"{mean_sd([study.value(r, split) for r in one.values()])}"
                f" | {mean_sd([study.value(r, split) for r in each.values()])} | "
                + ", ".join(f"{s}: {study.value(r, split):.4f}" for s, r in sorted(drawn.items()))
                + f" | {fmt(study.gap(tok, size, 'learned', v, split))} |"
            )
    if not lines:
        return []
    return [
        "## Codebook variance",
        "",
        "Seed s > 1 of a drawn code also ran with code_seed s, at each size's own length only: the "
        "spread over "
        "seeds with one codebook (the config's, every seed) against one codebook per seed (seed 1 "
        "keeps the "
        "config's). The gaps at a size's own length use the second; the training-length and "
        "equal-token runs "
        "use the first (each table says which).",
        "",
        "| size | variant | split | one codebook, mean ± sd | a codebook per seed | the drawn "
        "codebooks (seed: "
        "value) | gap to learned, a codebook per seed |",
        "|---|---|---|---:|---:|---|---:|",
        *lines,
        "",
    ]


def control_lines(study: Study, tok: str, size: str, corrected: dict[str, float]) -> list[str]:
    """A row per control; each difference led by its Holm p from ``corrected`` (test label -> p)."""
    lines = [
        f"| variant (size {size.upper()}) | lr | seeds | trainable params | val bits/byte | − "
        "learned: Holm p; "
        "mean ± sd (95 % CI) | − binary16: Holm p; mean ± sd (95 % CI) | position: learned 0, "
        "binary16 1 "
        "(95 % CI) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    learned = study.values(study.cell(tok, size, "learned"), "val")
    binary = study.values(study.cell(tok, size, "binary16"), "val")
    for v in CONTROLS:
        cell = study.cell(tok, size, v)
        if not cell:
            continue
        mine = study.values(cell, "val")
        cols = []
        for name, ref in (("learned", learned), ("binary16", binary)):
            p = paired(ref, mine)
            low, high = p.ci()
            adjusted = corrected.get(f"{v} − {name}, {size.upper()}, val", math.nan)
            holm_p = "--" if math.isnan(adjusted) else f"{adjusted:.3g}"
            cols.append(
                f"{holm_p}; {fmt(p)}" + ("" if math.isnan(low) else f" ({low:+.3f}, {high:+.3f})")
            )
        share = study.position(tok, size, v)
        low, high = share.ci()
        where = (
            f"{share.mean:.2f}" + ("" if math.isnan(low) else f" ({low:.2f}, {high:.2f})")
            if share.n
            else "--"
        )
        lines.append(
            f"| {v}: {LABELS[v]} | {study.rate(tok, size, v):g} | {len(cell)} | "
            f"{next(iter(cell.values()))['trainable_params']:,} | "
            f"{mean_sd(list(mine.values()))} | {cols[0]} | {cols[1]} | {where} |"
        )
    return lines


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
        f"{kinds.count('difference')} two-sided "
        "paired t-tests over seeds (every gap and control above with 2 or more seeds that differ) "
        "and "
        f"{kinds.count('slope')} slopes (every slope above; t with the interval's degrees of "
        "freedom). With 3 "
        "seeds a paired test has 2 degrees of freedom.",
        "",
        "| test | seeds | estimate | 95 % CI | p | p (Holm) | word |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for label, (c, adj) in tested.items():
        lines.append(
            f"| {label} | {len(c.per_seed)} | {c.estimate:+.4f} | {c.low:+.4f}, {c.high:+.4f} | "
            f"{c.p:.3g} | "
            f"{adj:.3g} | {word(adj, c)} |"
        )
    return lines


def codebook_note(study: Study, tok: str, points: Sequence[tuple[str, int | None]]) -> str:
    """Which of the points' gf2 cells use a codebook per seed and which the config's at every
    seed, and how far the per-seed codebooks move gf2's mean from the config's."""
    per_seed, one = [], []
    for size, steps in points:
        cell = study.cell(tok, size, "gf2", steps)
        if not cell:
            continue
        where = f"{size.upper()} at {updates(study.first(tok, size, steps)):,} updates"
        if any(parse(r)["code"] is not None for r in cell.values()):
            config = study.cell(tok, size, "gf2", steps, fold=False)
            moved = ", ".join(
                f"{_mean(study, cell, split) - _mean(study, config, split):+.4f} {split}"
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


def _mean(study: Study, cell: dict, split: str) -> float:
    finite = [
        x for x in study.values(cell, split).values() if math.isfinite(x)
    ]  # a diverged run counts for none
    return statistics.mean(finite) if finite else math.nan


def design_lines(
    study: Study,
    tok: str,
    per_param: Sequence,
    per_token: Sequence,
    claims: dict | None = None,
    names: Sequence[str] = ("", ""),
) -> list[str]:
    """Each gap's size slope at equal tokens per parameter and at equal tokens, side by side,
    each with its word."""
    lines = []
    for split in SPLITS:
        for a, b in GAPS[:2]:
            fits = [
                _points(study, tok, points, a, b, split, "params")
                for points in (per_param, per_token)
            ]
            if min(len(xs) for xs, _ in fits) < 2:
                continue
            fits = [slope_fit(xs, samples) for xs, samples in fits]
            text = [
                f"{slope:+.3f} "
                f"({'no interval' if math.isnan(low) else f'95 % {low:+.3f} to {high:+.3f}'}"
                f"{_said(claims, slope_label(name, a, b, split))})"
                for (slope, low, high), name in zip(fits, names, strict=True)
            ]
            lines.append(
                f"- {b} − {a} ({split}): {text[0]} at equal tokens per parameter; {text[1]} at "
                "equal "
                "tokens"
            )
    return lines


def _points(
    study: Study, tok: str, points: Sequence, a: str, b: str, split: str, x: str
) -> tuple[list, list]:
    """A fit's x (non-embedding parameters or training tokens) and per-seed gaps, at the points
    with a gap."""
    xs, samples = [], []
    for size, steps in points:
        gap = study.gap(tok, size, a, b, split, steps)
        if gap.n:
            row = study.first(tok, size, steps)
            xs.append(non_embedding(row) if x == "params" else row["tokens_seen"])
            samples.append(gap.diffs)
    return xs, samples


def moved_lines(study: Study, tok: str, size: str) -> list[str]:
    """Each length whose rates came from a sweep at another length than the size's own: its gaps
    at the own-length sweep's rates beside those at the chosen sweep's (the seeds each has run),
    so the move is read where it is."""
    own = {v: study.best(tok, size, v) for v in PAPER}
    rows = []
    for n in study.lengths(tok, size):
        sweep = study.chosen_at(tok, size, n)
        chosen = {v: study.best(tok, size, v, sweep) for v in PAPER}
        if sweep is None or None in (*chosen.values(), *own.values()) or chosen == own:
            continue
        for label, rates in (
            (f"{updates(study.first(tok, size, None)):,}", own),
            (f"{sweep:,}", chosen),
        ):
            cells = {v: study.cell(tok, size, v, n, lr=rates[v]) for v in PAPER}
            gaps = [
                fmt(paired(study.values(cells[a], split), study.values(cells[b], split)))
                for split in SPLITS
                for a, b in GAPS
            ]
            lr = "/".join(f"{rates[v]:g}" for v in PAPER)
            seeds = "/".join(str(len(cells[v])) for v in PAPER)
            rows.append(
                f"| {updates(study.first(tok, size, n)):,} | {label} | {lr} | {seeds} | "
                + " | ".join(gaps)
                + " |"
            )
    if not rows:
        return []
    head = [f"{b} − {a} ({split})" for split in SPLITS for a, b in GAPS]
    return [
        f"How the rates swept at another length move {size.upper()}'s gaps (each at the seeds it "
        "ran):",
        "",
        "| updates | rates swept at (updates) | lr (l/b/g) | seeds (l/b/g) | "
        + " | ".join(head)
        + " |",
        "|---:|---:|---|---:|" + "---:|" * len(head),
        *rows,
        "",
    ]
