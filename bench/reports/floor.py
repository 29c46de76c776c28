"""The floor: the untrained trunk evaluated the same way, and which cells are not above it.

A cell whose test metric is not significantly above what the same trunk
scores before any training has learned nothing the comparison can use: it
has collapsed, and any verdict resting on it would be evidence of nothing
(METHODS.md, fair comparison). The test is one-sided at `ALPHA` on the
primary metric, paired by seed when the floor was evaluated with the cell's
final seeds (each seed's own initialisation, common random numbers), else
Welch.

Not significant is not the same as collapsed. A cell is *collapsed* when
the data show it at the floor: it is not significantly above it, and the
upper bound of its interval rules out a gain of `WEAK_SHARE` of the best
cell's. A cell whose interval is too wide to say either (two or three
seeds of a noisy metric) is *not shown above the floor*, with its seed
count: more seeds decide it. Claims treat both alike (nothing rests on a
cell the harness cannot show trained).

Significance is not enough: with five seeds a cell that gained a point of
MAP@R over the untrained trunk, while the best cell gained forty, is
"above the floor" and still a failed training. Its `share`, the cell's gain
over the floor as a fraction of the best cell's, marks it *barely trained*
below `WEAK_SHARE`; a claim resting on such a cell is refused like one on
a collapsed cell, since its verdict would judge the failed training, not
the method.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bench.reports.source import Results
from bench.stats import Difference, compare

ALPHA = 0.05
WEAK_SHARE = 0.25  # of the best cell's gain over the floor


@dataclass(frozen=True)
class FloorCheck:
    """A cell against the floor on one metric; `collapsed` is None when it cannot be tested."""

    cell: str
    metric: str
    difference: Difference
    share: float | None = None  # gain over the floor / the best cell's gain; None when no cell gained
    best_gain: float | None = None  # the best cell's mean gain over the floor, on `metric`

    @property
    def below(self) -> bool | None:
        """Not significantly above the floor (collapsed, or not shown above it); None when untestable."""
        d = self.difference
        if not d.testable:
            return None
        return not d.p_greater < ALPHA

    @property
    def collapsed(self) -> bool:
        """The data show the cell at the floor: not above it, and its interval rules out a real gain."""
        if not self.below:
            return False
        d = self.difference
        return self.best_gain is not None and self.best_gain > 0 and d.high < WEAK_SHARE * self.best_gain

    @property
    def unresolved(self) -> bool:
        """Not significantly above the floor, but the interval is too wide to call the cell collapsed."""
        return bool(self.below) and not self.collapsed

    @property
    def weak(self) -> bool:
        """Above the floor, but by less than `WEAK_SHARE` of what the best cell gained."""
        return self.below is False and self.share is not None and self.share < WEAK_SHARE

    def describe(self) -> str:
        """The leaderboard's note: what the test found, with its p-value and kind."""
        d = self.difference
        if not d.testable:
            return f"not testable against the floor ({d.n_a} seed(s), floor {d.n_b})"
        test = f"{d.test}, one-sided p = {d.p_greater:.3g}"
        if self.collapsed:
            return (
                f"collapsed: at the floor on {self.metric} (not significantly above it, and its interval "
                f"rules out {WEAK_SHARE:.0%} of the best cell's gain; {test})"
            )
        if self.unresolved:
            return (
                f"not shown above the floor on {self.metric} with {d.n_a} seeds ({test}): the interval "
                f"{d.low:+.3f} to {d.high:+.3f} is too wide to say; more seeds decide it"
            )
        if self.weak:
            return (
                f"barely trained: {self.share:.0%} of the best cell's gain over the floor on {self.metric} "
                f"(below {WEAK_SHARE:.0%}; {test})"
            )
        return f"above the floor on {self.metric} ({test})"


def check(res: Results, cell: str, metric: str | None = None) -> FloorCheck | None:
    """The cell against the floor, or None when the results carry no floor (runs before floor.csv existed)."""
    metric = metric or res.primary
    floor, floor_seeds = res.floor_values(metric, cell)  # a learned-metric cell's own floor where it has one
    if len(floor) == 0:
        return None
    values: list[float] = list(res.values(cell, metric)) if cell in res.cells else []
    d = compare(values, list(floor), res.seeds(cell) if cell in res.cells else [], floor_seeds)
    base = float(np.mean(floor))
    means = [float(np.mean(v)) for c in res.cells if len(v := res.values(c, metric))]
    best = max(means, default=base) - base
    share = (float(np.mean(values)) - base) / best if values and best > 0 else None
    return FloorCheck(cell, metric, d, share, best if best > 0 else None)
