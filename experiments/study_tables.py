"""The study report's tables (study_report.py puts them in order): the sweep, the gaps by size and
length with their slopes, the codebook spread, the controls and the paired tests.

"mean ± sd" is the sample sd over seeds; a 95 % interval is the t interval of the mean.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from experiments.study_plan import CODED, CONTROLS, LABELS, PAPER
from experiments.study_results import GAPS, SPLITS, Study, non_embedding, updates
from experiments.study_stats import Paired, holm, paired, slope_fit

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
    return text + (f" ({len(values) - len(finite)} diverged or unscored)" if len(finite) < len(values) else "")


def _cells(study: Study, tok: str, size: str, variants: Sequence[str], steps: int | None = None) -> str:
    rates = [study.rate(tok, size, v, steps) for v in variants]
    return "/".join("--" if lr is None else f"{lr:g}" for lr in rates)


def sweep_lines(study: Study, tok: str, sizes: Sequence[str]) -> list[str]:
    lines = ["## The learning-rate sweep (seed 1, validation bits/byte)", "",
             "Each size is swept on its own; a variant whose best rate was at the edge of its rates got the next "
             "rung. The best rate (bold) is the one every later stage uses at that size.", ""]  # fmt: skip
    for size in sizes:
        lrs = sorted({lr for v in PAPER for lr in study.swept(tok, size, v)})
        if len(lrs) < 2:
            continue
        lines += [f"Size {size.upper()}:", "", "| variant | " + " | ".join(f"{lr:g}" for lr in lrs) + " | best |",
                  "|---|" + "---:|" * (len(lrs) + 1)]  # fmt: skip
        for v in PAPER:
            scored, best = study.swept(tok, size, v), study.best(tok, size, v)
            cells = [("**{:.4f}**" if lr == best else "{:.4f}").format(scored[lr]) if lr in scored else "--"
                     for lr in lrs]  # fmt: skip
            lines.append(f"| {v} | " + " | ".join(cells) + f" | {'--' if best is None else f'{best:g}'} |")
        lines.append("")
    return lines


def gap_table(study: Study, tok: str, points: Sequence[tuple[str, int | None]], first: str) -> list[str]:
    """A row per (size, steps): the three paired gaps on both splits."""
    head = [f"{b} − {a} ({split})" for split in SPLITS for a, b in GAPS]
    lines = [f"| {first} | non-emb. params | updates | tokens / non-emb. param | lr (l/b/g) | seeds (l/b/g) | "
             + " | ".join(head) + " |", "|---|---:|---:|---:|---|---:|" + "---:|" * len(head)]  # fmt: skip
    for size, steps in points:
        row = study.first(tok, size, steps)
        seeds = "/".join(str(len(study.cell(tok, size, v, steps))) for v in PAPER)
        gaps = [fmt(study.gap(tok, size, a, b, split, steps)) for split in SPLITS for a, b in GAPS]
        lines.append(f"| {size.upper()} | {non_embedding(row):,} | {updates(row):,} | "
                     f"{row['tokens_seen'] / non_embedding(row):.2f} | {_cells(study, tok, size, PAPER, steps)} | "
                     f"{seeds} | " + " | ".join(gaps) + " |")  # fmt: skip
    return lines


def fit_lines(study: Study, tok: str, points: Sequence[tuple[str, int | None]], x: str) -> list[str]:
    """The slope of each gap per decade of ``x`` (non-embedding parameters or tokens), with its interval."""
    lines = []
    for split in SPLITS:
        for a, b in GAPS[:2]:
            xs, samples = [], []
            for size, steps in points:
                gap = study.gap(tok, size, a, b, split, steps)
                if gap.n:
                    row = study.first(tok, size, steps)
                    xs.append(non_embedding(row) if x == "params" else row["tokens_seen"])
                    samples.append(gap.diffs)
            if len(xs) < 2:
                continue
            slope, low, high = slope_fit(xs, samples)
            unit = "10x parameters" if x == "params" else "10x training tokens"
            spread = "no interval: a point has one seed" if math.isnan(low) else f"95 % {low:+.4f} to {high:+.4f}"
            lines.append(f"- {b} − {a} ({split}): {slope:+.4f} bits/byte per {unit} ({spread}; {len(xs)} points, "
                         f"{sum(map(len, samples))} runs)")  # fmt: skip
    return lines


def size_table(study: Study, tok: str, sizes: Sequence[str]) -> list[str]:
    header = ["size", "variant", "lr", "seeds", "trainable params", "targets", *SPLITS.values(),
              *[t for _, t, _, _ in SCORES], "wall / run (min)"]  # fmt: skip
    lines = ["| " + " | ".join(header) + " |", "|---|---|" + "---:|" * (len(header) - 2)]
    for size in sizes:
        for v in PAPER:
            runs = list(study.cell(tok, size, v).values())
            if not runs:
                continue
            cells = [size.upper(), v, f"{study.rate(tok, size, v):g}", str(len(runs)),
                     f"{runs[0]['trainable_params']:,}", f"{runs[0]['tokens_seen'] / 1e6:.2f}M",
                     *[mean_sd([study.value(r, split) for r in runs]) for split in SPLITS]]  # fmt: skip
            for key, _, scale, decimals in SCORES:
                cells.append(mean_sd([r["scores"][key]["value"] for r in runs if key in r.get("scores", {})], scale,
                                     decimals))  # fmt: skip
            whole = [r["wall_seconds"] for r in runs if not r.get("resumed")]  # a resumed run's wall is partial
            cells.append(f"{statistics.mean(whole) / 60:.1f}" if whole else "--")
            lines.append("| " + " | ".join(cells) + " |")
    return lines


def codebook_lines(study: Study, tok: str) -> list[str]:
    """Where a codebook was drawn per seed: each seed's value with the config's codebook and with its own."""
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
            lines.append(f"| {size.upper()} | {v} | {split} | {mean_sd([study.value(r, split) for r in one.values()])}"
                         f" | {mean_sd([study.value(r, split) for r in each.values()])} | "
                         + ", ".join(f"{s}: {study.value(r, split):.4f}" for s, r in sorted(drawn.items()))
                         + f" | {fmt(study.gap(tok, size, 'learned', v, split))} |")  # fmt: skip
    if not lines:
        return []
    return ["## Codebook variance", "",
            "Seed s > 1 of a drawn code also ran with code_seed s: the spread over seeds with one codebook (the "
            "config's, every seed) against one codebook per seed (seed 1 keeps the config's). The gaps in this "
            "report use the second.", "",
            "| size | variant | split | one codebook, mean ± sd | a codebook per seed | the drawn codebooks (seed: "
            "value) | gap to learned, a codebook per seed |", "|---|---|---|---:|---:|---|---:|",
            *lines, ""]  # fmt: skip


def control_lines(study: Study, tok: str, size: str) -> list[str]:
    lines = [f"| variant (size {size.upper()}) | lr | seeds | trainable params | val bits/byte | − learned (95 % CI) | "
             "− binary16 (95 % CI) | position: learned 0, binary16 1 (95 % CI) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    learned = study.values(study.cell(tok, size, "learned"), "val")
    binary = study.values(study.cell(tok, size, "binary16"), "val")
    for v in CONTROLS:
        cell = study.cell(tok, size, v)
        if not cell:
            continue
        mine = study.values(cell, "val")
        cols = []
        for ref in (learned, binary):
            p = paired(ref, mine)
            low, high = p.ci()
            cols.append(fmt(p) + ("" if math.isnan(low) else f" ({low:+.3f}, {high:+.3f})"))
        share = Paired(tuple(x for x in ((mine[s] - learned[s]) / (binary[s] - learned[s]) for s in sorted(mine)
                                         if s in learned and s in binary) if math.isfinite(x)))  # fmt: skip
        low, high = share.ci()
        where = f"{share.mean:.2f}" + ("" if math.isnan(low) else f" ({low:.2f}, {high:.2f})") if share.n else "--"
        lines.append(f"| {v}: {LABELS[v]} | {study.rate(tok, size, v):g} | {len(cell)} | "
                     f"{next(iter(cell.values()))['trainable_params']:,} | "
                     f"{mean_sd(list(mine.values()))} | {cols[0]} | {cols[1]} | {where} |")  # fmt: skip
    return lines


def tests(study: Study, tok: str, sizes: Sequence[str]) -> list[tuple[str, Paired]]:
    """Every comparison the report reads a claim from, as one family for the multiple-test correction."""
    family = []
    for size in sizes:
        for steps in study.lengths(tok, size):
            where = f"{size.upper()}, {study.tokens(tok, size, steps) / 1e6:.2f}M tokens"
            for split in SPLITS:
                family += [(f"{b} − {a}, {where}, {split}", study.gap(tok, size, a, b, split, steps)) for a, b in GAPS]
    for v in CONTROLS:
        for ref in ("learned", "binary16"):
            p = study.gap(tok, study.tune, ref, v, "val")
            if p.n:
                family.append((f"{v} − {ref}, {study.tune.upper()}, val", p))
    return family


def test_lines(family: list[tuple[str, Paired]]) -> list[str]:
    adjusted = holm([p.p for _, p in family])
    counted = sum(not math.isnan(p) for p in adjusted)
    lines = ["## Paired tests", "",
             f"Two-sided paired t-tests over seeds, {counted} comparisons in one family (every gap and control "
             "above with 2 or more seeds); Holm's correction holds the family-wise error at the stated level. "
             "With 3 seeds a test has 2 degrees of freedom: a difference can be consistent in sign across seeds "
             "and still not be established.", "",
             "| comparison | seeds | mean difference | 95 % CI | p | p (Holm) |",
             "|---|---:|---:|---:|---:|---:|"]  # fmt: skip
    for (label, p), adj in zip(family, adjusted, strict=True):
        if math.isnan(adj):
            continue
        low, high = p.ci()
        lines.append(f"| {label} | {p.n} | {p.mean:+.4f} | {low:+.4f}, {high:+.4f} | {p.p:.3g} | {adj:.3g} |")
    return lines
