"""The study report's statistics: paired differences over seeds, Holm's correction, a slope over
sizes.

Small samples (3 seeds) make every interval wide; the report states them rather than hiding
them, and states how many comparisons a family of tests holds.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats


@dataclass(frozen=True)
class Paired:
    """Differences b - a over the seeds both ran: mean, sd, a 95 % t interval and a two-sided
    t-test p (scipy's paired t-test, which is its one-sample test of the differences)."""

    diffs: tuple[float, ...]

    @property
    def n(self) -> int:
        return len(self.diffs)

    @property
    def mean(self) -> float:
        return statistics.mean(self.diffs) if self.diffs else math.nan

    @property
    def sd(self) -> float:
        return statistics.stdev(self.diffs) if self.n > 1 else math.nan

    def ci(self) -> tuple[float, float]:
        """The 95 % t interval of the mean; NaN for fewer than 2 seeds (one seed has no spread to
        measure)."""
        if self.n < 2:
            return math.nan, math.nan
        if self.sd == 0:  # no spread: the interval is the mean (scipy would warn and give NaN)
            return self.mean, self.mean
        low, high = stats.ttest_1samp(self.diffs, 0.0).confidence_interval()
        return float(low), float(high)

    @property
    def p(self) -> float:
        """Two-sided paired t-test of a zero mean difference; NaN below 2 seeds or with no
        spread."""
        if self.n < 2 or self.sd == 0:
            return math.nan
        return float(stats.ttest_1samp(self.diffs, 0.0).pvalue)


def by_seed(a: dict[int, float], b: dict[int, float]) -> dict[int, float]:
    """``b[seed] - a[seed]`` over the seeds both have with a finite value (a diverged run pairs
    with nothing)."""
    both = [s for s in sorted(set(a) & set(b)) if math.isfinite(a[s]) and math.isfinite(b[s])]
    return {s: b[s] - a[s] for s in both}


def paired(a: dict[int, float], b: dict[int, float]) -> Paired:
    return Paired(tuple(by_seed(a, b).values()))


def holm(ps: Sequence[float]) -> list[float]:
    """Holm-Bonferroni adjusted p-values (family-wise error), in the input's order; NaN stays
    NaN and is not counted as a test."""
    tested = sorted((p, i) for i, p in enumerate(ps) if not math.isnan(p))
    adjusted = [math.nan] * len(ps)
    running = 0.0
    for rank, (p, i) in enumerate(tested):
        running = max(running, min(1.0, (len(tested) - rank) * p))
        adjusted[i] = running
    return adjusted


def slope_fit(
    xs: Sequence[float], samples: Sequence[Sequence[float]]
) -> tuple[float, float, float, float]:
    """The least-squares slope of y on log10(x) through every point's mean, its 95 % interval
    from the seed noise of every point at once, and the two-sided p of a zero slope.

    ``samples[i]`` holds the per-seed values at ``xs[i]`` (a gap per seed). The slope is a
    weighted sum of the means, ``sum(w_i * mean_i)``, so its variance is ``sum(w_i**2 * s_i**2 /
    n_i)``; the interval and the p are t with Welch-Satterthwaite degrees of freedom. (A bootstrap
    over 3 seeds would understate it: resampling 3 values shrinks their spread by sqrt(2/3), and
    its percentiles are normal, not t.) The interval holds no misfit to a line, which 3 points
    cannot measure. Returns ``(slope, low, high, p)`` in y per decade of x; NaN bounds where a
    point has one seed, and a NaN p there or where the seeds do not vary (no noise to test
    against).
    """
    logs = np.log10(np.asarray(xs, dtype=float))
    weights = (logs - logs.mean()) / ((logs - logs.mean()) ** 2).sum()
    slope = float(sum(w * statistics.mean(v) for w, v in zip(weights, samples, strict=True)))
    if min(map(len, samples)) < 2:
        return slope, math.nan, math.nan, math.nan
    parts = [w**2 * statistics.variance(v) / len(v) for w, v in zip(weights, samples, strict=True)]
    variance = sum(parts)
    if variance == 0:
        return slope, slope, slope, math.nan
    pairs = zip(parts, samples, strict=True)
    df = variance**2 / sum(part**2 / (len(v) - 1) for part, v in pairs if part)
    half = float(stats.t.ppf(0.975, df)) * math.sqrt(variance)
    p = float(2 * stats.t.sf(abs(slope) / math.sqrt(variance), df))
    return slope, slope - half, slope + half, p
