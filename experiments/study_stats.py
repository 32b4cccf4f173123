"""The study report's statistics: paired differences over seeds, Holm's correction, a seed-bootstrap fit.

Small samples (3 seeds) make every interval wide; the report states them rather than hiding them, and
states how many comparisons a family of tests holds.
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
    """Differences b - a over the seeds both ran: mean, sd, a 95 % t interval and a two-sided t-test p."""

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

    def ci(self, level: float = 0.95) -> tuple[float, float]:
        """The t interval of the mean; NaN for fewer than 2 seeds (one seed has no spread to measure)."""
        if self.n < 2:
            return math.nan, math.nan
        half = stats.t.ppf(0.5 + level / 2, self.n - 1) * self.sd / math.sqrt(self.n)
        return self.mean - half, self.mean + half

    @property
    def p(self) -> float:
        """Two-sided paired t-test of a zero mean difference; NaN below 2 seeds or with no spread."""
        if self.n < 2 or self.sd == 0:
            return math.nan
        t = self.mean / (self.sd / math.sqrt(self.n))
        return float(2 * stats.t.sf(abs(t), self.n - 1))


def paired(a: dict[int, float], b: dict[int, float]) -> Paired:
    """``b[seed] - a[seed]`` over the seeds both have."""
    return Paired(tuple(b[s] - a[s] for s in sorted(set(a) & set(b))))


def holm(ps: Sequence[float]) -> list[float]:
    """Holm-Bonferroni adjusted p-values (family-wise error), in the input's order; NaN stays NaN and is not
    counted as a test."""
    tested = sorted((p, i) for i, p in enumerate(ps) if not math.isnan(p))
    adjusted = [math.nan] * len(ps)
    running = 0.0
    for rank, (p, i) in enumerate(tested):
        running = max(running, min(1.0, (len(tested) - rank) * p))
        adjusted[i] = running
    return adjusted


def bootstrap_fit(xs: Sequence[float], samples: Sequence[Sequence[float]], draws: int = 2000,
                  seed: int = 0) -> tuple[float, float, float]:  # fmt: skip
    """The least-squares slope of y on log10(x) over every point's mean, and its 95 % seed-bootstrap interval.

    ``samples[i]`` holds the per-seed values at ``xs[i]`` (a gap per seed); each draw resamples the seeds
    of every point with replacement and refits, so the interval holds the seed noise of every point at
    once, not of a chosen pair. Returns ``(slope, low, high)`` in y per decade of x.
    """
    if len(xs) < 2 or any(not s for s in samples):
        raise ValueError(f"a fit needs 2 or more points, each with a value: got {len(xs)} points")
    logs = np.log10(np.asarray(xs, dtype=float))
    slope = float(np.polyfit(logs, [statistics.mean(s) for s in samples], 1)[0])
    rng = np.random.default_rng(seed)
    slopes = [
        np.polyfit(logs, [float(np.mean(rng.choice(np.asarray(s), len(s)))) for s in samples], 1)[0]
        for _ in range(draws)
    ]
    low, high = np.percentile(slopes, [2.5, 97.5])
    return slope, float(low), float(high)
