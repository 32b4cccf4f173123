"""The study report's figures (render.py names them): the sweep, the gaps by size and by
length, the validation curves and the controls, each written whole or not at all."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.colors import TABLEAU_COLORS
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter, NullLocator

from experiments.plan.names import CONTROLS, LABELS, PAPER
from experiments.report.results import GAPS, SPLITS, Points, Study
from fixed_embed.atomic import atomic_path

# Tableau's colors in the order the variants are declared (learned blue, binary16 orange, ...)
COLORS = dict(zip((*PAPER, *CONTROLS), TABLEAU_COLORS, strict=False))


def _panels(items: Sequence, width: float, height: float) -> tuple[Figure, zip]:
    """A row of panels, one per item: the figure and each (panel, item)."""
    figure, axes = plt.subplots(1, len(items), figsize=(width, height), squeeze=False)
    return figure, zip(axes[0], items, strict=True)


def _axes(axis, title: str, xlabel: str, ylabel: str) -> None:
    axis.set(xscale="log", xlabel=xlabel, ylabel=ylabel)
    axis.set_title(title, fontsize=10)
    axis.grid(alpha=0.3)


def _ticks_at(axis, xs: Sequence[float], text) -> None:
    """Ticks at the plotted x values only, each labelled by ``text``: matplotlib's own labels on
    a log axis that spans about a decade fall on minor ticks, which overlap."""
    # points that print alike share the smallest's tick
    labels = {text(x): x for x in sorted(xs, reverse=True)}
    axis.set_xticks(list(labels.values()), list(labels), fontsize=8)
    axis.xaxis.set_minor_locator(NullLocator())


def _millions(x: float) -> str:
    return f"{x / 1e6:.3g}M"


def _save(figure: Figure, path: Path, columns: int = 3, note: str = "") -> None:
    """The first panel's legend below every panel (never over data), a note under it, and the
    file."""
    handles, labels = figure.axes[0].get_legend_handles_labels()
    lift = 0.05 if note else 0.0  # the note's line
    figure.legend(
        handles,
        labels,
        loc="lower center",
        ncol=columns,
        fontsize=8,
        frameon=False,
        bbox_to_anchor=(0.5, lift),
    )
    if note:
        figure.text(0.5, 0.01, note, ha="center", va="bottom", fontsize=8, wrap=True)
    rows = math.ceil(len(labels) / columns)  # the legend's
    figure.tight_layout(rect=(0, 0.06 * rows + lift, 1, 1))
    _write_png(figure, path)


def _write_png(figure, path: Path) -> None:
    """A kill mid-render leaves the previous figure, never half of one."""
    with atomic_path(path) as tmp:
        # the temporary name has no .png to infer it from
        figure.savefig(tmp, dpi=110, format="png")
    plt.close(figure)


def plot_sweep(study: Study, sweeps: Points, path: Path) -> None:
    """A panel per sweep (size, length): seed 1 at each rate, the best circled, with a band from
    it to + the seed sd there (study.spread): a rate inside the band is a near-tie one seed
    cannot order."""
    figure, panels = _panels(sweeps, 4.4 * len(sweeps), 3.9)
    for axis, (size, steps) in panels:
        rates = []
        for v in PAPER:
            scored = {
                lr: x for lr, x in sorted(study.swept(size, v, steps).items()) if math.isfinite(x)
            }
            rates += scored
            axis.plot(
                list(scored), list(scored.values()), marker="o", color=COLORS[v], label=LABELS[v]
            )
            best, (spread, _) = study.best(size, v, steps), study.spread(size, v, steps)
            if best in scored:
                axis.scatter(
                    [best], [scored[best]], s=90, facecolors="none", edgecolors="black", zorder=3
                )
                if spread.n > 1:
                    axis.axhspan(
                        scored[best],
                        scored[best] + spread.sd,
                        color=COLORS[v],
                        alpha=0.2,
                        linewidth=0,
                    )
        _axes(
            axis,
            f"size {size.upper()}, {study.trained(size, steps):,} updates (seed 1)",
            "peak learning rate",
            "validation bits/byte",
        )
        _ticks_at(axis, rates, lambda lr: f"{lr:g}")
    _save(
        figure,
        path,
        note="circle: each variant's best; band: from the best to + 1 seed sd over seeds "
        "(a rate inside it is a near-tie one seed cannot order)",
    )


def plot_gaps(study: Study, series: dict[str, Points], x: str, path: Path, note: str = "") -> None:
    """A panel per split; a line per gap (fixed code − learned, and gf2 − binary16) per series
    of points. A point an earlier series drew (the same runs) is joined by a later series' line
    but not drawn again."""
    figure, panels = _panels(SPLITS, 11, 4.6)
    for axis, split in panels:
        plotted, drawn = [], set()
        for (name, points), style in zip(series.items(), ("-", "--", ":"), strict=False):
            for a, b in GAPS:
                gaps = {p: study.gap(p[0], a, b, split, p[1]) for p in points}
                kept = [point for point, gap in gaps.items() if gap.n]
                xs = [study.params(*p) if x == "params" else study.per_param(*p) for p in kept]
                plotted += xs
                if not xs:
                    continue
                label, means = f"{b} − {a}", [gaps[p].mean for p in kept]
                color = COLORS[b] if a == "learned" else "black"
                new = [i for i, point in enumerate(kept) if (point, label) not in drawn]
                drawn.update((point, label) for point in kept)
                axis.plot(
                    xs,
                    means,
                    marker="o",
                    markevery=new,
                    linestyle=style,
                    color=color,
                    label=f"{label}{name}",
                )
                axis.errorbar(
                    [xs[i] for i in new],
                    [means[i] for i in new],
                    yerr=np.nan_to_num([gaps[kept[i]].sd for i in new]),
                    fmt="none",
                    capsize=4,
                    color=color,
                )
        axis.axhline(0, color="black", linewidth=0.8)
        xlabel = (
            "non-embedding parameters"
            if x == "params"
            else "training tokens per non-embedding parameter"
        )
        _axes(axis, SPLITS[split], xlabel, f"gap, {SPLITS[split].split(' (')[0]} (mean ± sd)")
        _ticks_at(axis, plotted, _millions if x == "params" else (lambda n: f"{n:.2g}"))
    _save(figure, path, columns=2 if len(series) > 1 else 3, note=note)


def plot_curves(study: Study, path: Path) -> None:
    """Validation bits/byte against training tokens: mean line and ± sd band over seeds, a panel
    per size, every training length of the size on the same axes."""
    figure, panels = _panels(study.sizes, 4.6 * len(study.sizes), 3.9)
    for axis, size in panels:
        key = []
        for steps, style in zip(study.lengths(size), ("-", "--", "-.", ":"), strict=False):
            n = study.trained(size, steps)
            key.append(Line2D([], [], color="black", linestyle=style, label=f"{n:,} updates"))
            for v in PAPER:
                runs = [
                    r
                    for r in study.cell(size, v, steps).values()
                    if r["curves"].get("val/bits_per_byte")
                ]
                if not runs:
                    continue
                curves = [r["curves"]["val/bits_per_byte"] for r in runs]
                length = min(map(len, curves))
                points = np.array([c[:length] for c in curves])  # run, validation, (step, value)
                xs = (points[0, :, 0] + 1) * (runs[0]["tokens_seen"] / n)  # tokens at each step
                mean = points[:, :, 1].mean(axis=0)
                sd = points[:, :, 1].std(axis=0, ddof=1) if len(runs) > 1 else np.zeros(length)
                axis.plot(
                    xs,
                    mean,
                    color=COLORS[v],
                    linestyle=style,
                    marker="o",
                    markersize=3,
                    label=v if steps is None else None,
                )
                axis.fill_between(xs, mean - sd, mean + sd, color=COLORS[v], alpha=0.2)
        _axes(axis, f"size {size.upper()}", "training tokens", "validation bits/byte")
        if len(key) > 1:  # the line styles differ by panel: each panel keys its own
            axis.legend(
                handles=key, fontsize=7, loc="upper right", title="trained for", title_fontsize=7
            )
        # 1-2-5 labels only: a curve's axis spans one or two decades, where minor labels overlap
        axis.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        axis.xaxis.set_major_formatter(FuncFormatter(lambda x, _: _millions(x)))
        axis.xaxis.set_minor_formatter(NullFormatter())
    _save(figure, path)


def plot_controls(study: Study, path: Path) -> None:
    """Each control minus learned and minus binary16, paired by seed, and its position on the
    line from learned (0) to binary16 (1): mean, 95 % CI and the seeds."""
    size = study.tune
    variants = [v for v in CONTROLS if study.cell(size, v)]
    figure, panels = _panels(("learned", "binary16", "position"), 15, 4.6)
    for axis, ref in panels:
        for i, v in enumerate(variants):
            p = study.position(size, v) if ref == "position" else study.gap(size, ref, v, "val")
            if not p.n:
                continue
            low, high = p.ci()
            if not math.isnan(low):
                axis.errorbar(
                    [i],
                    [p.mean],
                    yerr=[[p.mean - low], [high - p.mean]],
                    fmt="D",
                    capsize=5,
                    color=COLORS[v],
                    zorder=2,
                )
            axis.scatter([i + 0.12] * p.n, p.diffs, color="black", s=9, zorder=3)
        gap = study.gap(size, "learned", "binary16", "val")
        if ref == "position":
            for y, v in ((0, "learned"), (1, "binary16")):
                axis.axhline(y, color=COLORS[v], linestyle="--", linewidth=1, label=f"{v} ({y})")
        elif gap.n:
            sign, label = (
                (1, "binary16 − learned") if ref == "learned" else (-1, "learned − binary16")
            )
            axis.axhline(
                sign * gap.mean, color="tab:orange", linestyle="--", linewidth=1, label=label
            )
        axis.axhline(0, color="black", linewidth=0.8)
        axis.set_xticks(range(len(variants)), variants, rotation=25, ha="right", fontsize=8)
        what = "position: learned 0, binary16 1" if ref == "position" else f"minus {ref}"
        axis.set_ylabel(
            "position (val, per seed)"
            if ref == "position"
            else f"validation bits/byte − {ref} (paired)"
        )
        axis.set_title(
            f"size {size.upper()}: {what}\n(◆ mean, 95 % CI, uncorrected; dots: seeds)", fontsize=10
        )
        axis.grid(alpha=0.3, axis="y")
        axis.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.28), frameon=False)
    figure.tight_layout()
    _write_png(figure, path)
