"""The study report's figures (study_report.py names them): the sweep, the gaps by size and by length,
the validation curves and the controls, each written whole or not at all."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter, NullLocator

from experiments.study_plan import CONTROLS, LABELS, PAPER
from experiments.study_results import GAPS, SPLITS, Study, non_embedding, updates
from fixed_embed.atomic import atomic_path

COLORS = {"learned": "tab:blue", "binary16": "tab:orange", "gf2": "tab:green", "matched": "tab:red",
          "norm_matched": "tab:purple", "random_full": "tab:brown", "lowrank_binary": "tab:pink",
          "lowrank_normal": "tab:gray"}  # fmt: skip
GAP_COLORS = {"binary16": "tab:orange", "gf2": "tab:green", "gf2 − binary16": "black"}


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
