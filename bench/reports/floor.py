"""The floor: the untrained trunk evaluated the same way, and which cells are not above it.

A cell whose test metric is not significantly above what the same trunk
scores before any training has learned nothing the comparison can use: it
has collapsed, and any verdict resting on it would be evidence of nothing
(METHODS.md, fair comparison). The test is one-sided at `ALPHA` on the
primary metric, paired by seed when the floor was evaluated with the cell's
final seeds (each seed's own initialisation, common random numbers), else
Welch.
"""

from __future__ import annotations

from dataclasses import dataclass

from bench.reports.source import Results
from bench.reports.stats import Difference, compare

ALPHA = 0.05


@dataclass(frozen=True)
class FloorCheck:
    """A cell against the floor on one metric; `collapsed` is None when it cannot be tested."""

    cell: str
    metric: str
    difference: Difference

    @property
    def collapsed(self) -> bool | None:
        d = self.difference
        if not d.testable:
            return None
        return not d.p_greater < ALPHA

    def describe(self) -> str:
        """The leaderboard's note: what the test found, with its p-value and kind."""
        d = self.difference
        if not d.testable:
            return f"not testable against the floor ({d.n_a} seed(s), floor {d.n_b})"
        test = f"{d.test}, one-sided p = {d.p_greater:.3g}"
        if self.collapsed:
            return f"collapsed: not significantly above the floor on {self.metric} ({test})"
        return f"above the floor on {self.metric} ({test})"


def check(res: Results, cell: str, metric: str | None = None) -> FloorCheck | None:
    """The cell against the floor, or None when the results carry no floor (runs before floor.csv existed)."""
    metric = metric or res.primary
    floor, floor_seeds = res.floor_values(metric)
    if len(floor) == 0:
        return None
    values: list[float] = list(res.values(cell, metric)) if cell in res.cells else []
    d = compare(values, list(floor), res.seeds(cell) if cell in res.cells else [], floor_seeds)
    return FloorCheck(cell, metric, d)
