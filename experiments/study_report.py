"""The study's report (see study.py): tables and figures drawn from its runs file alone.

Every number comes from ``OUT-runs.json``: a row per run with its validation bits per byte, its lm-eval
scores, its wall time and its logged curves. Nothing is read from ``logs/``, so the report can be redrawn
on any machine from the committed file (``--render``).

Two splits: **val** (validation bits/byte over the 9 held-out books) chooses every learning rate;
**test** (WikiText-2 bits/byte, out of domain) is read by no choice. Differences between variants are
paired by training seed (the same seed: the same data order and, for the two fixed codes, the same
initial weights); "mean ± sd" is the sample sd over seeds, a 95 % interval is the t interval of the mean.
Where a codebook was drawn per seed (``-codeC`` runs), a variant's seeds use them, so its spread holds
the codebook's variance.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from functools import cache
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter, NullLocator

from experiments.runs import ROOT, merged_config
from experiments.study_plan import CODED, CONTROLS, METRIC, PAPER, SIZES, non_embedding_params, parse_name, widened
from experiments.study_stats import Paired, holm, paired, slope_fit
from fixed_embed.atomic import atomic_path, atomic_write_text

LABELS = {
    "learned": "learned table",
    "binary16": "binary code (binary16)",
    "gf2": "GF(2) recoding (gf2)",
    "matched": "binary16, SwiGLU widened to learned's trainable params",
    "norm_matched": "learned table, rows at the binary code's norm",
    "random_full": "fixed random codes, d wide",
    "lowrank_binary": "learned V x K code from the binary code (LR x10, no decay)",
    "lowrank_normal": "learned V x K code from N(0, 0.71²) (LR x10, no decay)",
}
COLORS = {"learned": "tab:blue", "binary16": "tab:orange", "gf2": "tab:green", "matched": "tab:red",
          "norm_matched": "tab:purple", "random_full": "tab:brown", "lowrank_binary": "tab:pink",
          "lowrank_normal": "tab:gray"}  # fmt: skip
TEST = "wikitext2_local|bits_per_byte|0"
WORD_PPL = "wikitext2_local|word_perplexity|0"
SPLITS = {"val": "validation bits/byte (books; chooses the rates)", "test": "WikiText-2 bits/byte (no choice reads it)"}
GAPS = (("learned", "binary16"), ("learned", "gf2"), ("binary16", "gf2"))  # (a, b): b - a
GAP_COLORS = {"binary16": "tab:orange", "gf2": "tab:green", "gf2 − binary16": "black"}
SCORES = [  # (column key, title, scale, decimals)
    ("gutenberg_ppl|bits_per_byte|0", "lm-eval books bits/byte", 1.0, 3),
    ("gutenberg_word_order|acc|0", "books word order acc (%)", 100.0, 1),
]
Cell = dict[int, dict]  # seed -> row


def parse(row: dict) -> dict:
    """The tokenizer, size, variant, rate, seed, updates and codebook in the row's name."""
    return parse_name(row["name"])


def _finite(value: float | None) -> float:
    """A diverged run (NaN, inf or nothing logged) ranks last."""
    return value if value is not None and math.isfinite(value) else math.inf


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


def _config(row: dict) -> dict:
    return _merged(row["config"])


@cache  # a render reads each run's configs for every table and figure it appears in; nothing mutates them
def _merged(configs: str) -> dict:
    return merged_config([ROOT / c for c in configs.split(" + ")])


def non_embedding(row: dict) -> int:
    return non_embedding_params(widened(_config(row)["model"]["decoder"], row["extra"]))


def updates(row: dict) -> int:
    """The updates a run trained: its name's ``-stepsN``, else its size file's."""
    return parse(row)["steps"] or _config(row)["trainer"]["max_steps"]


def wikitext_ratio(rows: list[dict]) -> float | None:
    """WikiText-2 bits/byte per nat of word perplexity: words / (bytes ln 2) of the fixed test text.

    Rows scored before the suite logged bits/byte (study v2's) carry the word perplexity only; the ratio
    of the rows that log both converts them exactly (the same text for every run, so one constant)."""
    ratios = [r["scores"][TEST]["value"] / math.log(r["scores"][WORD_PPL]["value"]) for r in rows
              if TEST in r.get("scores", {}) and WORD_PPL in r["scores"]]  # fmt: skip
    ratios = [x for x in ratios if math.isfinite(x)]  # a diverged run scores inf or NaN
    if not ratios:
        return None
    if max(ratios) - min(ratios) > 1e-9 * max(ratios):
        raise ValueError(f"WikiText-2 bits/byte over ln(word ppl) differs across runs ({min(ratios)}..{max(ratios)})"
                         ": the test text changed between runs, so they cannot be compared")  # fmt: skip
    return statistics.mean(ratios)


class Study:
    """The runs, indexed by (tokenizer, size, variant, steps) -> {lr: {seed: {code: row}}}."""

    def __init__(self, rows: list[dict], tune: str = "m") -> None:
        self.rows, self.tune = rows, tune
        self.ratio = wikitext_ratio(rows)
        self.index: dict[tuple, dict[float, dict[int, dict[int | None, dict]]]] = {}
        for row in rows:
            m = parse(row)
            by_lr = self.index.setdefault((m["tok"], m["size"], m["variant"], m["steps"]), {})
            by_lr.setdefault(m["lr"], {}).setdefault(m["seed"], {})[m["code"]] = row

    def value(self, row: dict, split: str) -> float:
        if split == "val":
            return _finite(row.get(METRIC))
        scores = row.get("scores", {})
        if TEST in scores:
            return scores[TEST]["value"]
        if WORD_PPL in scores and self.ratio is not None:
            return self.ratio * math.log(scores[WORD_PPL]["value"])
        return math.nan

    def sizes(self, tok: str) -> list[str]:
        found = {key[1] for key in self.index if key[0] == tok}
        return [s for s in SIZES if s in found]

    def swept(self, tok: str, size: str, variant: str) -> dict[float, float]:
        """Seed 1's validation bits/byte per rate at the size's own length and codebook."""
        by_lr = self.index.get((tok, size, variant, None), {})
        return {lr: _finite(seeds[1][None].get(METRIC)) for lr, seeds in by_lr.items() if None in seeds.get(1, {})}

    def best(self, tok: str, size: str, variant: str) -> float | None:
        scored = self.swept(tok, size, variant)
        return min(scored, key=scored.get) if len(scored) > 1 else None

    def rate(self, tok: str, size: str, variant: str, steps: int | None = None) -> float | None:
        """The rate a variant is compared at: its best of the size's sweep (a control: its paper variant's),
        as the study chose it; for a run outside the plan, the rate with the most seeds."""
        by_lr = self.index.get((tok, size, variant, steps), {})
        chosen = self.best(tok, size, CONTROLS.get(variant, variant))
        if chosen in by_lr:
            return chosen
        return max(by_lr, key=lambda lr: (len(by_lr[lr]), -lr)) if by_lr else None

    def cell(self, tok: str, size: str, variant: str, steps: int | None = None, fold: bool = True) -> Cell:
        """Seed -> row at the compared rate; with ``fold``, seed s uses codebook s where it was drawn."""
        lr = self.rate(tok, size, variant, steps)
        seeds = self.index.get((tok, size, variant, steps), {}).get(lr, {})
        own = {s: codes[s] for s, codes in seeds.items() if fold and s > 1 and s in codes}  # seed 1: the config's
        return {s: own.get(s, codes.get(None)) for s, codes in sorted(seeds.items()) if s in own or None in codes}

    def values(self, cell: Cell, split: str) -> dict[int, float]:
        return {s: self.value(row, split) for s, row in cell.items()}

    def gap(self, tok: str, size: str, a: str, b: str, split: str, steps: int | None = None) -> Paired:
        return paired(self.values(self.cell(tok, size, a, steps), split),
                      self.values(self.cell(tok, size, b, steps), split))  # fmt: skip

    def lengths(self, tok: str, size: str) -> list[int | None]:
        """The training lengths any paper variant ran at ``size``, shortest first (None: the size's own); a
        variant that has not run one shows "--" there."""
        found = {steps for t, s, v, steps in self.index if (t, s) == (tok, size) and v in PAPER}
        return sorted(found, key=lambda n: self.tokens(tok, size, n))

    def tokens(self, tok: str, size: str, steps: int | None) -> int:
        return self.first(tok, size, steps)["tokens_seen"]

    def first(self, tok: str, size: str, steps: int | None) -> dict:
        """A run of a paper variant at ``size`` and ``steps`` (for what they share: parameters, tokens)."""
        return next(row for v in PAPER for row in self.cell(tok, size, v, steps).values())


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


def _axes(axis, title: str, xlabel: str, ylabel: str) -> None:
    axis.set_xscale("log")
    axis.set_title(title, fontsize=10)
    axis.set_xlabel(xlabel)
    axis.set_ylabel(ylabel)
    axis.grid(alpha=0.3)


def _ticks_at(axis, xs: Sequence[float], text) -> None:
    """Ticks at the plotted x values only, each labelled by ``text``: matplotlib's own labels on a log axis
    that spans about a decade fall on minor ticks, which overlap."""
    labels = {text(x): x for x in sorted(xs, reverse=True)}  # points that print alike share the smallest's tick
    axis.set_xticks(list(labels.values()), list(labels), fontsize=8)
    axis.xaxis.set_minor_locator(NullLocator())


def _millions(x: float) -> str:
    return f"{x / 1e6:.3g}M"


def _save(figure, axes, path: Path, columns: int = 3) -> None:
    """The first panel's legend below every panel (never over data), and the file."""
    handles, labels = axes[0].get_legend_handles_labels()
    figure.legend(handles, labels, loc="lower center", ncol=columns, fontsize=8, frameon=False)
    figure.tight_layout(rect=(0, 0.1, 1, 1))
    _write_png(figure, path)


def _write_png(figure, path: Path) -> None:
    """A kill mid-render leaves the previous figure, never half of one."""
    with atomic_path(path) as tmp:
        figure.savefig(tmp, dpi=110, format="png")  # the temporary name has no .png to infer it from
    plt.close(figure)


def plot_sweep(study: Study, tok: str, sizes: Sequence[str], path: Path) -> None:
    figure, axes = plt.subplots(1, len(sizes), figsize=(4.4 * len(sizes), 3.8), squeeze=False)
    for axis, size in zip(axes[0], sizes, strict=True):
        rates = []
        for v in PAPER:
            scored = {lr: x for lr, x in sorted(study.swept(tok, size, v).items()) if math.isfinite(x)}
            rates += scored
            axis.plot(list(scored), list(scored.values()), marker="o", color=COLORS[v], label=LABELS[v])
            best = study.best(tok, size, v)
            if best in scored:
                axis.scatter([best], [scored[best]], s=90, facecolors="none", edgecolors="black", zorder=3)
        _axes(axis, f"size {size.upper()} (seed 1; circle: best)", "peak learning rate", "validation bits/byte")
        _ticks_at(axis, rates, lambda lr: f"{lr:g}")
    _save(figure, axes[0], path)


def _gap_series(study: Study, tok: str, points: Sequence[tuple[str, int | None]], split: str, x: str):
    for a, b in GAPS:
        label = b if a == "learned" else f"{b} − {a}"
        xs, means, sds = [], [], []
        for size, steps in points:
            gap = study.gap(tok, size, a, b, split, steps)
            if gap.n:
                row = study.first(tok, size, steps)
                xs.append(non_embedding(row) if x == "params" else row["tokens_seen"] / non_embedding(row))
                means.append(gap.mean)
                sds.append(0.0 if math.isnan(gap.sd) else gap.sd)
        yield label, xs, means, sds


def plot_gaps(study: Study, tok: str, series: dict[str, list[tuple[str, int | None]]], x: str, path: Path) -> None:
    """A panel per split; a line per gap (fixed code − learned, and gf2 − binary16) per series of points."""
    figure, axes = plt.subplots(1, len(SPLITS), figsize=(11, 4.2), squeeze=False)
    styles = ("-", "--", ":")
    for axis, split in zip(axes[0], SPLITS, strict=True):
        plotted = []
        for (name, points), style in zip(series.items(), styles, strict=False):
            for label, xs, means, sds in _gap_series(study, tok, points, split, x):
                plotted += xs
                if xs:
                    text = f"{label} − learned" if label in PAPER else label
                    axis.errorbar(xs, means, yerr=sds, marker="o", capsize=4, linestyle=style,
                                  color=GAP_COLORS[label], label=f"{text}{name}")  # fmt: skip
        axis.axhline(0, color="black", linewidth=0.8)
        xlabel = "non-embedding parameters" if x == "params" else "training tokens per non-embedding parameter"
        _axes(axis, SPLITS[split], xlabel, f"gap, {SPLITS[split].split(' (')[0]} (mean ± sd)")
        _ticks_at(axis, plotted, _millions if x == "params" else (lambda n: f"{n:.2g}"))
    _save(figure, axes[0], path)


def plot_curves(study: Study, tok: str, sizes: Sequence[str], path: Path) -> None:
    """Validation bits/byte against training tokens: mean line and ± sd band over seeds, a panel per size,
    every training length of the size on the same axes."""
    figure, axes = plt.subplots(1, len(sizes), figsize=(4.6 * len(sizes), 3.9), squeeze=False)
    for axis, size in zip(axes[0], sizes, strict=True):
        for steps, style in zip(study.lengths(tok, size), ("-", "--", "-.", ":"), strict=False):
            for v in PAPER:
                runs = [r for r in study.cell(tok, size, v, steps).values() if r["curves"].get("val/bits_per_byte")]
                if not runs:
                    continue
                per_update = runs[0]["tokens_seen"] / updates(runs[0])
                curves = [r["curves"]["val/bits_per_byte"] for r in runs]
                length = min(map(len, curves))
                xs = [(p[0] + 1) * per_update for p in curves[0][:length]]
                points = [[c[i][1] for c in curves] for i in range(length)]
                mean = [statistics.mean(p) for p in points]
                sd = [statistics.stdev(p) if len(p) > 1 else 0.0 for p in points]
                label = f"{v}" if steps is None else None
                axis.plot(xs, mean, color=COLORS[v], linestyle=style, marker="o", markersize=3, label=label)
                low = [m - s for m, s in zip(mean, sd, strict=True)]
                high = [m + s for m, s in zip(mean, sd, strict=True)]
                axis.fill_between(xs, low, high, color=COLORS[v], alpha=0.2)
        _axes(axis, f"size {size.upper()} (longer runs dashed)", "training tokens", "validation bits/byte")
        # 1-2-5 labels only: a curve's axis spans one or two decades, where minor labels overlap
        axis.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        axis.xaxis.set_major_formatter(FuncFormatter(lambda x, _: _millions(x)))
        axis.xaxis.set_minor_formatter(NullFormatter())
    _save(figure, axes[0], path)


def plot_controls(study: Study, tok: str, size: str, path: Path) -> None:
    """Each control minus learned and minus binary16, paired by seed: mean, 95 % CI and the seeds."""
    variants = [v for v in ("gf2", *CONTROLS) if study.cell(tok, size, v)]
    figure, axes = plt.subplots(1, 2, figsize=(11, 4.4), squeeze=False)
    for axis, ref in zip(axes[0], ("learned", "binary16"), strict=True):
        for i, v in enumerate(variants):
            p = study.gap(tok, size, ref, v, "val")
            if not p.n:
                continue
            low, high = p.ci()
            if not math.isnan(low):
                axis.errorbar([i], [p.mean], yerr=[[p.mean - low], [high - p.mean]], fmt="D", capsize=5,
                              color=COLORS[v], zorder=2)  # fmt: skip
            axis.scatter([i + 0.12] * p.n, p.diffs, color="black", s=9, zorder=3)
        gap = study.gap(tok, size, "learned", "binary16", "val")
        if gap.n:
            sign, label = (1, "binary16 − learned") if ref == "learned" else (-1, "learned − binary16")
            axis.axhline(sign * gap.mean, color="tab:orange", linestyle="--", linewidth=1, label=label)
        axis.axhline(0, color="black", linewidth=0.8)
        axis.set_xticks(range(len(variants)), variants, rotation=25, ha="right", fontsize=8)
        axis.set_ylabel(f"validation bits/byte − {ref} (paired)")
        axis.set_title(f"size {size.upper()}: minus {ref} (◆ mean, 95 % CI; dots: seeds)", fontsize=10)
        axis.grid(alpha=0.3, axis="y")
        axis.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.28), frameon=False)
    figure.tight_layout()
    _write_png(figure, path)


def validation_set(row: dict) -> str:
    """What the study validated on, from the run's configs."""
    data = _config(row).get("data", {})
    blocks = f"{data.get('val_sequences')} blocks of {data.get('seq_len')} targets"
    if data.get("val_per_document"):
        return f"{blocks} spread over every held-out document, the same for every run"
    return f"{blocks}, the same for every run"


def render(data: dict, out: Path, tune: str = "m") -> None:
    """``OUT.md`` and its figures from the runs file's contents."""
    study = Study(data["runs"], tune)
    stem = out.name
    if not study.rows:
        raise SystemExit(f"{stem}: the runs file has no runs yet")
    out.parent.mkdir(parents=True, exist_ok=True)
    tok = "bpe8k" if any(parse(r)["tok"] == "bpe8k" for r in study.rows) else parse(study.rows[0])["tok"]
    sizes = study.sizes(tok)
    own = [(size, None) for size in sizes]
    hours = sum(r["wall_seconds"] for r in study.rows if not r.get("adopted_from")) / 3600
    adopted = sorted({r["adopted_from"] for r in study.rows if r.get("adopted_from")})
    n_adopted = sum(bool(r.get("adopted_from")) for r in study.rows)
    resumed = sum(bool(r.get("resumed")) for r in study.rows)
    commits = sorted({r["commit"][:10] for r in study.rows})
    lines = [f"# {data['title'].split(':')[0]}", "",
             f"{len(study.rows)} runs"
             + (f", {n_adopted} of them adopted from {', '.join(f'`{a}`' for a in adopted)} (the same flags: "
                "copied, not rerun)" if n_adopted else "")
             + f"; {hours:.1f} h of training and evaluation summed over the runs trained here"
             + (f" ({resumed} resumed after a stop count their last attempt only)" if resumed else "")
             + f". Every row of [`{stem}-runs.json`]({stem}-runs.json) holds its configs, flags, commit, curves "
             f"and scores; [`{stem}-runs.md`]({stem}-runs.md) lists them. Commits: "
             + ", ".join(f"`{c}`" for c in commits) + ".", "",
             f"Two splits. **val**: validation bits per byte ({validation_set(study.rows[0])}); it chooses every "
             "learning rate. **test**: WikiText-2 bits per byte (its 60 validation articles, out of domain); no "
             "choice reads it. Both are tokenizer-free. Gaps are paired by training seed, which sets the "
             "initialisation and the data order; a gap is the second variant's bits/byte minus the first's.",
             ""]  # fmt: skip
    lines += sweep_lines(study, tok, sizes)
    if any(len(study.swept(tok, s, v)) > 1 for s in sizes for v in PAPER):
        lines += [f"![learning-rate sweep]({stem}-sweep.png)", ""]
        plot_sweep(study, tok, [s for s in sizes if any(len(study.swept(tok, s, v)) > 1 for v in PAPER)],
                   out.parent / f"{stem}-sweep.png")  # fmt: skip
    lines += ["## The gap across model sizes, each at its own best rates", "",
              *gap_table(study, tok, own, "size"), "", "A slope over every size (least squares on log10 "
              "parameters through each size's mean gap; the t interval holds the seed noise of every size, not "
              "the misfit to a line, which 3 sizes cannot measure):", "",
              *fit_lines(study, tok, own, "params"), "", *size_table(study, tok, sizes), ""]  # fmt: skip
    equal = [(s, n) for s in sizes for n in study.lengths(tok, s)]
    largest = sizes[-1] if sizes else None
    target = study.tokens(tok, largest, None) if largest and (tok, largest, "learned", None) in study.index else 0
    same = [(s, n) for s, n in equal if study.tokens(tok, s, n) == target]
    series = {"": own}
    if len(same) > 1:
        lines += [f"## Equal training tokens ({target / 1e6:.2f}M, size {largest.upper()}'s), across sizes", "",
                  "Size apart from training length: every size trained on the same tokens (so the smaller sizes "
                  "see more tokens per parameter).", "", *gap_table(study, tok, same, "size"), "",
                  *fit_lines(study, tok, same, "params"), ""]  # fmt: skip
        series[f", {target / 1e6:.2f}M tokens"] = same
    lines += [f"![gap vs size]({stem}-gap.png)", ""]
    plot_gaps(study, tok, series, "params", out.parent / f"{stem}-gap.png")
    long = {s: [(s, n) for n in study.lengths(tok, s)] for s in sizes if len(study.lengths(tok, s)) > 1}
    if long:
        lines += ["## The gap across training lengths, at a fixed size", "",
                  "The size's best rates (from its own-length sweep), its warm-up 10 % of the updates."]  # fmt: skip
        for points in long.values():
            lines += ["", *gap_table(study, tok, points, "size"), "", *fit_lines(study, tok, points, "tokens")]
        lines += ["", f"![gap vs training length]({stem}-length.png)", ""]
        plot_gaps(study, tok, {f", size {s.upper()}": p for s, p in long.items()}, "tokens",
                  out.parent / f"{stem}-length.png")  # fmt: skip
    lines += [f"![validation bits/byte]({stem}-val-bpb.png)", ""]
    plot_curves(study, tok, sizes, out.parent / f"{stem}-val-bpb.png")
    lines += codebook_lines(study, tok)
    if any(study.cell(tok, tune, c) for c in CONTROLS):
        lines += ["## Controls and the parameter-matched baseline", "",
                  "Paired by seed at the control's paper variant's rate. The position puts a control on the line "
                  "from learned (0) to binary16 (1), per seed: a fixed-code control at 0.75 closes a quarter of the "
                  "gap; a learned-table control at 0.25 gives up a quarter of it.", "",
                  *control_lines(study, tok, tune), "", f"![controls]({stem}-controls.png)", ""]  # fmt: skip
        plot_controls(study, tok, tune, out.parent / f"{stem}-controls.png")
    lines += [*test_lines(tests(study, tok, sizes)), ""]
    for t in sorted({parse(r)["tok"] for r in study.rows} - {tok}):
        own_t = [(s, None) for s in study.sizes(t)]
        lines += [f"## Tokenizer {t}", "", *size_table(study, t, study.sizes(t)), "",
                  *gap_table(study, t, own_t, "size"), ""]  # fmt: skip
    lines += ["## Commands", "", "```bash", "make study                                # every stage; resumes",
              "python experiments/study.py --render      # redraw this page from the runs file",
              "# each run (plus --trainer.logger.init_args.save_dir=logs/study-v3 --trainer.logger.init_args.name=RUN"
              " --ckpt_path=last), then fixed-embed eval RUN/checkpoints/last.ckpt --suite study:"]  # fmt: skip
    for row in study.rows:
        configs = " ".join(f"--config {c}" for c in row["config"].split(" + "))
        lines.append(f"fixed-embed fit {configs} {' '.join(row['extra'])}".rstrip())
    lines += ["```", ""]
    atomic_write_text(f"{out}.md", "\n".join(lines) + "\n")
