"""Intervals and tests over per-seed values: the project's one implementation, on `scipy.stats`.

A cell is trained with a handful of seeds, so every statement about it is a
statement about a small sample: the t distribution (not the normal) sets the
interval widths (`scipy.stats.t.interval`). Two cells are compared with
Welch's test (`ttest_ind(equal_var=False)`), which does not assume that two
methods vary equally across seeds, or, when both were run with the same
final seeds, with the paired t-test on the per-seed differences
(`ttest_rel`): the runner gives seed s the same initialisation and batch
order in every cell (common random numbers), so the seed's luck cancels in
the difference. Pairing stays valid where that luck is not shared; it then
only costs degrees of freedom.

What scipy does not decide is wrapped here, the same everywhere:

* NaN values (a failed seed, a metric not computed) are dropped first;
* with fewer than two values there is no estimate of the spread: intervals,
  degrees of freedom and p-values are NaN and nothing is ever significant;
* with zero variance (identical seeds, e.g. a deterministic trunk) the
  interval collapses to the observed value and a test is decided by the
  sign of the difference: what every seed shows identically is real.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import stats as _st

LEVEL = 0.95
NAN = math.nan


def _clean(values: Sequence[float] | np.ndarray) -> np.ndarray:
    a = np.asarray(values, dtype=float)
    return a[np.isfinite(a)]


@dataclass(frozen=True)
class Interval:
    """A mean with its two-sided t interval; `low`/`high` are NaN when n < 2."""

    mean: float
    low: float
    high: float
    n: int
    clipped: bool = False  # a bound was moved to the metric's range (see `within`)

    @property
    def defined(self) -> bool:
        return math.isfinite(self.low) and math.isfinite(self.high)


# The range each metric can take; an interval reaching beyond it is clipped for display (`within`).
# AMI can fall below 0 (worse than chance), so only its top is bounded.
METRIC_RANGES: dict[str, tuple[float, float]] = {
    "precision_at_1": (0.0, 1.0),
    "r_precision": (0.0, 1.0),
    "map_at_r": (0.0, 1.0),
    "recall_at_k": (0.0, 1.0),
    "nmi": (0.0, 1.0),
    "ami": (-1.0, 1.0),
    "lake_accuracy": (0.0, 1.0),
    "reid_map": (0.0, 1.0),
    "cmc_at_k": (0.0, 1.0),
}


def metric_range(metric: str) -> tuple[float, float]:
    """The values a metric can take (every built-in one lies in [0, 1] but AMI, which can be negative);
    a metric not listed is unbounded."""
    key = next((f"{p}k" for p in ("recall_at_", "cmc_at_") if metric.startswith(p)), metric)  # one column per k
    return METRIC_RANGES.get(key, (-math.inf, math.inf))


def within(iv: Interval, metric: str) -> Interval:
    """The interval with its bounds clipped to the metric's range, marked `clipped` when that changed them.

    A t interval is symmetric around the mean, so three seeds near 1.0 give
    a high bound above 1: a value no run can reach. The mean is never moved.
    """
    bottom, top = metric_range(metric)
    if not iv.defined or (bottom <= iv.low and iv.high <= top):
        return iv
    return Interval(iv.mean, max(iv.low, bottom), min(iv.high, top), iv.n, clipped=True)


def t_interval(values: Sequence[float] | np.ndarray, level: float = LEVEL) -> Interval:
    """Mean and t interval over seeds (the interval `summary.csv` and every report use)."""
    a = _clean(values)
    n = len(a)
    if n == 0:
        return Interval(NAN, NAN, NAN, 0)
    mean = float(a.mean())
    if n < 2:
        return Interval(mean, NAN, NAN, n)
    sem = float(_st.sem(a))
    if sem == 0.0:
        return Interval(mean, mean, mean, n)
    low, high = _st.t.interval(level, n - 1, loc=mean, scale=sem)
    return Interval(mean, float(low), float(high), n)


@dataclass(frozen=True)
class Difference:
    """An effect (`mean(a) - mean(b)`, or a mean against a reference) with its interval and one-sided p-values.

    `p_greater` tests H1: effect > 0; `p_less` tests H1: effect < 0. All of
    `low`, `high`, `df` and the p-values are NaN when a side has fewer than
    two values: the effect is then observed but not testable. `test` names
    the test: "Welch", "paired" or "one-sample".
    """

    diff: float
    low: float
    high: float
    df: float
    p_greater: float
    p_less: float
    n_a: int
    n_b: int
    test: str = "Welch"
    se: float = NAN  # standard error of the effect

    @property
    def testable(self) -> bool:
        return math.isfinite(self.low) and math.isfinite(self.high)

    def shifted(self, by: float) -> tuple[float, float]:
        """One-sided p-values of the effect against `by` instead of 0: (H1: effect > by, H1: effect < by).

        The equivalence rules (`beats` against a margin, `within`) test
        against a non-zero value; the t statistic is recovered from the
        standard error.
        """
        if not self.testable:
            return NAN, NAN
        if not self.se > 0:  # zero variance: decided by the sign
            return (0.0 if self.diff > by else 1.0), (0.0 if self.diff < by else 1.0)
        t = (self.diff - by) / self.se
        return float(_st.t.sf(t, self.df)), float(_st.t.cdf(t, self.df))


def _untestable(diff: float, na: int, nb: int, test: str) -> Difference:
    return Difference(diff, NAN, NAN, NAN, NAN, NAN, na, nb, test)


def _constant(diff: float, na: int, nb: int, test: str) -> Difference:
    return Difference(diff, diff, diff, math.inf, 0.0 if diff > 0 else 1.0, 0.0 if diff < 0 else 1.0, na, nb, test, 0.0)


def _from_scipy(
    result: Any, diff: float, se: float, level: float, na: int, nb: int, test: str, shift: float = 0.0
) -> Difference:
    """scipy's interval and one-sided p-values (from its t statistic and df), shifted by `shift`."""
    ci = result.confidence_interval(level)
    t, df = float(result.statistic), float(result.df)
    return Difference(
        diff,
        float(ci.low) - shift,
        float(ci.high) - shift,
        df,
        float(_st.t.sf(t, df)),
        float(_st.t.cdf(t, df)),
        na,
        nb,
        test,
        se,
    )


def _flat(x: np.ndarray) -> bool:
    """Values equal but for float rounding (a constant shift of every seed, 0.3 minus 0.1 and 0.2 minus 0.0
    differing in the 17th digit): no spread to test, where scipy would divide by a variance of rounding
    noise and warn of catastrophic cancellation."""
    return float(np.ptp(x)) <= 1e-12 * max(1.0, float(np.abs(x).max()))


def welch(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray, level: float = LEVEL) -> Difference:
    """Welch's difference of means `a - b`, interval at `level` and one-sided tests."""
    x, y = _clean(a), _clean(b)
    nx, ny = len(x), len(y)
    diff = float(x.mean() - y.mean()) if nx and ny else NAN
    if nx < 2 or ny < 2:
        return _untestable(diff, nx, ny, "Welch")
    if _flat(x) and _flat(y):
        return _constant(diff, nx, ny, "Welch")
    se = math.sqrt(float(x.var(ddof=1)) / nx + float(y.var(ddof=1)) / ny)
    return _from_scipy(_st.ttest_ind(x, y, equal_var=False), diff, se, level, nx, ny, "Welch")


def paired(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray, level: float = LEVEL) -> Difference:
    """The paired t-test on per-seed differences `a[i] - b[i]` (same seeds, same order); NaN pairs dropped."""
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if x.shape != y.shape:
        raise ValueError(f"paired values need the same seeds: {len(x)} against {len(y)}")
    keep = np.isfinite(x) & np.isfinite(y)
    x, y = x[keep], y[keep]
    n = len(x)
    diff = float((x - y).mean()) if n else NAN
    if n < 2:
        return _untestable(diff, n, n, "paired")
    if _flat(x - y):
        return _constant(diff, n, n, "paired")
    return _from_scipy(_st.ttest_rel(x, y), diff, float(_st.sem(x - y)), level, n, n, "paired")


def compare(
    a: Sequence[float] | np.ndarray,
    b: Sequence[float] | np.ndarray,
    seeds_a: Sequence[int],
    seeds_b: Sequence[int],
    level: float = LEVEL,
) -> Difference:
    """`a - b`: paired when both were run with the same set of final seeds (values in seed order), else Welch."""
    if len(seeds_a) >= 2 and list(seeds_a) == list(seeds_b):
        return paired(a, b, level)
    return welch(a, b, level)


def one_sample(values: Sequence[float] | np.ndarray, reference: float, level: float = LEVEL) -> Difference:
    """`mean(values) - reference` for a published number that carries no spread of its own."""
    x = _clean(values)
    n = len(x)
    diff = float(x.mean()) - reference if n else NAN
    if n < 2:
        return _untestable(diff, n, 0, "one-sample")
    if _flat(x):
        return _constant(diff, n, 0, "one-sample")
    return _from_scipy(
        _st.ttest_1samp(x, reference), diff, float(_st.sem(x)), level, n, 0, "one-sample", shift=reference
    )


def holm(p: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (family-wise error control); NaN entries stay NaN, outside the family.

    Sorted ascending, the i-th smallest (0-based) of m is multiplied by m - i,
    and the running maximum keeps the adjusted values in the same order as
    the raw ones; capped at 1.
    """
    idx = [i for i, x in enumerate(p) if x is not None and math.isfinite(x)]
    m = len(idx)
    out = [NAN] * len(p)
    running = 0.0
    for rank, i in enumerate(sorted(idx, key=lambda j: p[j])):
        running = max(running, min(1.0, (m - rank) * p[i]))
        out[i] = running
    return out


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Rank correlation of validation and test scores; NaN with fewer than three cells."""
    a, b = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    keep = np.isfinite(a) & np.isfinite(b)
    if keep.sum() < 3 or np.ptp(a[keep]) == 0 or np.ptp(b[keep]) == 0:
        return NAN
    return float(_st.spearmanr(a[keep], b[keep]).statistic)
