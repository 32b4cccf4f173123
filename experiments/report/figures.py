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
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter, NullLocator

from experiments.plan.names import CONTROLS, LABELS, PAPER
from experiments.report.results import GAPS, SPLITS, Points, Study, non_embedding, updates
from fixed_embed.atomic import atomic_path

COLORS = {
    "learned": "tab:blue",
    "binary16": "tab:orange",
    "gf2": "tab:green",
    "matched": "tab:red",
    "norm_matched": "tab:purple",
    "random_full": "tab:brown",
    "lowrank_binary": "tab:pink",
    "lowrank_normal": "tab:gray",
}
GAP_COLORS = {
    "binary16 − learned": "tab:orange",
    "gf2 − learned": "tab:green",
    "gf2 − binary16": "black",
}


def _axes(axis, title: str, xlabel: str, ylabel: str) -> None:
    axis.set_xscale("log")
    axis.set_title(title, fontsize=10)
    axis.set_xlabel(xlabel)
    axis.set_ylabel(ylabel)
    axis.grid(alpha=0.3)


def _ticks_at(axis, xs: Sequence[float], text) -> None:
    """Ticks at the plotted x values only, each labelled by ``text``: matplotlib's own labels on
    a log axis that spans about a decade fall on minor ticks, which overlap."""
    labels = {
        text(x): x for x in sorted(xs, reverse=True)
    }  # points that print alike share the smallest's tick
    axis.set_xticks(list(labels.values()), list(labels), fontsize=8)
    axis.xaxis.set_minor_locator(NullLocator())


def _millions(x: float) -> str:
    return f"{x / 1e6:.3g}M"


def _save(figure, axes, path: Path, columns: int = 3, note: str = "") -> None:
    """The first panel's legend below every panel (never over data), a note under it, and the
    file."""
    handles, labels = axes[0].get_legend_handles_labels()
    rows = math.ceil(len(labels) / columns)
    bottom = 0.06 * rows + (0.05 if note else 0.0)
    figure.legend(
        handles,
        labels,
        loc="lower center",
        ncol=columns,
        fontsize=8,
        frameon=False,
        bbox_to_anchor=(0.5, 0.05 if note else 0.0),
    )
    if note:
        figure.text(0.5, 0.01, note, ha="center", va="bottom", fontsize=8, wrap=True)
    figure.tight_layout(rect=(0, bottom, 1, 1))
    _write_png(figure, path)


def _write_png(figure, path: Path) -> None:
    """A kill mid-render leaves the previous figure, never half of one."""
    with atomic_path(path) as tmp:
        figure.savefig(
            tmp, dpi=110, format="png"
        )  # the temporary name has no .png to infer it from
    plt.close(figure)


def plot_sweep(study: Study, tok: str, sweeps: Points, path: Path) -> None:
    """A panel per sweep (size, length): seed 1 at each rate, the best circled, with a band from
    it to + the seed sd there (study.spread): a rate inside the band is a near-tie one seed
    cannot order."""
    figure, axes = plt.subplots(1, len(sweeps), figsize=(4.4 * len(sweeps), 3.9), squeeze=False)
    for axis, (size, steps) in zip(axes[0], sweeps, strict=True):
        rates = []
        for v in PAPER:
            scored = {
                lr: x
                for lr, x in sorted(study.swept(tok, size, v, steps).items())
                if math.isfinite(x)
            }
            rates += scored
            axis.plot(
                list(scored), list(scored.values()), marker="o", color=COLORS[v], label=LABELS[v]
            )
            best, (spread, _) = study.best(tok, size, v, steps), study.spread(tok, size, v, steps)
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
            f"size {size.upper()}, {study.trained(tok, size, steps):,} updates (seed 1)",
            "peak learning rate",
            "validation bits/byte",
        )
        _ticks_at(axis, rates, lambda lr: f"{lr:g}")
    _save(
        figure,
        axes[0],
        path,
        note="circle: each variant's best; band: from the best to + 1 seed sd over seeds "
        "(a rate inside it is a near-tie one seed cannot order)",
    )


def plot_gaps(
    study: Study, tok: str, series: dict[str, Points], x: str, path: Path, note: str = ""
) -> None:
    """A panel per split; a line per gap (fixed code − learned, and gf2 − binary16) per series
    of points. A point an earlier series drew (the same runs) is joined by a later series' line
    but not drawn again."""
    figure, axes = plt.subplots(1, len(SPLITS), figsize=(11, 4.6), squeeze=False)
    for axis, split in zip(axes[0], SPLITS, strict=True):
        plotted, drawn = [], set()
        for (name, points), style in zip(series.items(), ("-", "--", ":"), strict=False):
            for a, b in GAPS:
                gaps = {p: study.gap(tok, p[0], a, b, split, p[1]) for p in points}
                kept = [point for point, gap in gaps.items() if gap.n]
                xs = [
                    non_embedding(study.first(tok, *p))
                    if x == "params"
                    else study.per_param(tok, *p)
                    for p in kept
                ]
                plotted += xs
                if not xs:
                    continue
                label, means = f"{b} − {a}", [gaps[p].mean for p in kept]
                new = [i for i, point in enumerate(kept) if (point, label) not in drawn]
                drawn.update((point, label) for point in kept)
                axis.plot(
                    xs,
                    means,
                    marker="o",
                    markevery=new,
                    linestyle=style,
                    color=GAP_COLORS[label],
                    label=f"{label}{name}",
                )
                axis.errorbar(
                    [xs[i] for i in new],
                    [means[i] for i in new],
                    yerr=[0.0 if math.isnan(gaps[kept[i]].sd) else gaps[kept[i]].sd for i in new],
                    fmt="none",
                    capsize=4,
                    color=GAP_COLORS[label],
                )
        axis.axhline(0, color="black", linewidth=0.8)
        xlabel = (
            "non-embedding parameters"
            if x == "params"
            else "training tokens per non-embedding parameter"
        )
        _axes(axis, SPLITS[split], xlabel, f"gap, {SPLITS[split].split(' (')[0]} (mean ± sd)")
        _ticks_at(axis, plotted, _millions if x == "params" else (lambda n: f"{n:.2g}"))
    _save(figure, axes[0], path, columns=2 if len(series) > 1 else 3, note=note)


def plot_curves(study: Study, tok: str, sizes: Sequence[str], path: Path) -> None:
    """Validation bits/byte against training tokens: mean line and ± sd band over seeds, a panel
    per size, every training length of the size on the same axes."""
    figure, axes = plt.subplots(1, len(sizes), figsize=(4.6 * len(sizes), 3.9), squeeze=False)
    for axis, size in zip(axes[0], sizes, strict=True):
        key = []
        for steps, style in zip(study.lengths(tok, size), ("-", "--", "-.", ":"), strict=False):
            n = study.trained(tok, size, steps)
            key.append(Line2D([], [], color="black", linestyle=style, label=f"{n:,} updates"))
            for v in PAPER:
                runs = [
                    r
                    for r in study.cell(tok, size, v, steps).values()
                    if r["curves"].get("val/bits_per_byte")
                ]
                if not runs:
                    continue
                per_update = runs[0]["tokens_seen"] / updates(runs[0])
                curves = [r["curves"]["val/bits_per_byte"] for r in runs]
                length = min(map(len, curves))
                xs = [(step + 1) * per_update for step, _ in curves[0][:length]]
                values = np.array([[y for _, y in c[:length]] for c in curves])
                mean = values.mean(axis=0)
                sd = values.std(axis=0, ddof=1) if len(runs) > 1 else np.zeros(length)
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
    _save(figure, axes[0], path)


def plot_controls(study: Study, tok: str, size: str, path: Path) -> None:
    """Each control minus learned and minus binary16, paired by seed, and its position on the
    line from learned (0) to binary16 (1): mean, 95 % CI and the seeds."""
    variants = [v for v in CONTROLS if study.cell(tok, size, v)]
    figure, axes = plt.subplots(1, 3, figsize=(15, 4.6), squeeze=False)
    for axis, ref in zip(axes[0], ("learned", "binary16", "position"), strict=True):
        for i, v in enumerate(variants):
            p = (
                study.position(tok, size, v)
                if ref == "position"
                else study.gap(tok, size, ref, v, "val")
            )
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
        gap = study.gap(tok, size, "learned", "binary16", "val")
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
