"""Intervals and tests over per-seed values.

A cell is trained with a handful of seeds, so every statement about it is a
statement about a small sample: the t distribution (not the normal) sets the
interval widths, and two cells are compared with Welch's test, which does not
assume that two methods (or two versions of the code) vary equally across
seeds. With a single seed there is no estimate of the spread at all: intervals
are then NaN and nothing is ever called significant.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
from scipy import stats as _st

LEVEL = 0.95


def _clean(values: Sequence[float]) -> np.ndarray:
    a = np.asarray(values, dtype=float)
    return a[np.isfinite(a)]


@dataclass(frozen=True)
class Interval:
    """A mean with its two-sided t interval; `low`/`high` are NaN when n < 2."""

    mean: float
    low: float
    high: float
    n: int

    @property
    def defined(self) -> bool:
        return math.isfinite(self.low) and math.isfinite(self.high)


def t_interval(values: Sequence[float], level: float = LEVEL) -> Interval:
    """Mean and t interval over seeds (the same interval `summary.csv` documents)."""
    a = _clean(values)
    n = len(a)
    if n == 0:
        return Interval(math.nan, math.nan, math.nan, 0)
    mean = float(a.mean())
    if n < 2:
        return Interval(mean, math.nan, math.nan, n)
    half = float(_st.t.ppf(0.5 + level / 2, n - 1)) * float(a.std(ddof=1)) / math.sqrt(n)
    return Interval(mean, mean - half, mean + half, n)


@dataclass(frozen=True)
class Difference:
    """`mean(a) - mean(b)` with Welch's interval and one-sided p-values.

    `p_greater` tests H1: mean(a) > mean(b); `p_less` tests H1: mean(a) < mean(b).
    All of `low`, `high`, `df` and the p-values are NaN when either side has
    fewer than two values: a difference is then observed but not testable.
    """

    diff: float
    low: float
    high: float
    df: float
    p_greater: float
    p_less: float
    n_a: int
    n_b: int

    @property
    def testable(self) -> bool:
        return math.isfinite(self.low) and math.isfinite(self.high)


def welch(a: Sequence[float], b: Sequence[float], level: float = LEVEL) -> Difference:
    """Welch's difference of means, interval at `level` and one-sided tests.

    When both samples have zero variance (identical seeds, e.g. a deterministic
    trunk) the interval collapses to the observed difference and the test is
    decided by its sign: a difference that every seed shows identically is real.
    """
    x, y = _clean(a), _clean(b)
    nx, ny = len(x), len(y)
    diff = float(x.mean() - y.mean()) if nx and ny else math.nan
    if nx < 2 or ny < 2:
        nan = math.nan
        return Difference(diff, nan, nan, nan, nan, nan, nx, ny)
    vx, vy = float(x.var(ddof=1)) / nx, float(y.var(ddof=1)) / ny
    se2 = vx + vy
    if se2 == 0.0:
        pg = 0.0 if diff > 0 else 1.0
        pl = 0.0 if diff < 0 else 1.0
        return Difference(diff, diff, diff, math.inf, pg, pl, nx, ny)
    df = se2**2 / (vx**2 / (nx - 1) + vy**2 / (ny - 1))
    se = math.sqrt(se2)
    half = float(_st.t.ppf(0.5 + level / 2, df)) * se
    t = diff / se
    return Difference(
        diff, diff - half, diff + half, df, float(_st.t.sf(t, df)), float(_st.t.cdf(t, df)), nx, ny
    )


def one_sample(values: Sequence[float], reference: float, level: float = LEVEL) -> Difference:
    """`mean(values) - reference` for a published number that carries no spread of its own."""
    x = _clean(values)
    n = len(x)
    iv = t_interval(x, level)
    diff = iv.mean - reference
    if n < 2:
        nan = math.nan
        return Difference(diff, nan, nan, nan, nan, nan, n, 0)
    sd = float(x.std(ddof=1))
    if sd == 0.0:
        return Difference(diff, diff, diff, math.inf, 0.0 if diff > 0 else 1.0, 0.0 if diff < 0 else 1.0, n, 0)
    t = diff * math.sqrt(n) / sd
    return Difference(
        diff, iv.low - reference, iv.high - reference, n - 1,
        float(_st.t.sf(t, n - 1)), float(_st.t.cdf(t, n - 1)), n, 0,
    )


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Rank correlation of validation and test scores; NaN with fewer than three cells."""
    a, b = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    keep = np.isfinite(a) & np.isfinite(b)
    if keep.sum() < 3 or np.ptp(a[keep]) == 0 or np.ptp(b[keep]) == 0:
        return math.nan
    return float(_st.spearmanr(a[keep], b[keep]).statistic)
