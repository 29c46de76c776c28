"""The budget check read back: did the ranking hold when every cell trained longer?

`bench.sweep.budget_check` retrains each cell's final configuration at a multiple
of the budget with the same final seeds. Here each cell's primary metric at
that multiple is paired seed by seed with its final (common random numbers:
seed s started both from the same trunk and the same batches), and the
change is the mean of the per-seed differences with its paired t interval
(`bench.stats.paired`).

For the table, the two rankings are compared: the leaderboard's (by mean
over seeds, ties by cell id) and the same rule at the multiple, over the
cells that have both. Kendall's tau (`scipy.stats.kendalltau`) is computed
on the two rank vectors, which carry no ties (the cell-id tie-break), so tau
is 1 exactly when no cell changed rank, and the cells that moved are named
with both ranks. The ranking is *stable* when the check covers every ranked
cell and tau is 1; a check that misses a cell (killed, or a seed failed in
every run) cannot say the ranking held.

A row trained with other parameters than the cell's finals (the cell was
run again with ``--redo`` after the check) checks another configuration and
is left out, so the cell counts as not checked until the check is rerun.

Several multiples may be recorded (``--multiple 2`` then ``--multiple 4``);
reports use the largest, unless told otherwise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd
from scipy.stats import kendalltau

from bench.reports.source import Results
from bench.stats import Difference, Interval, paired, t_interval, within


@dataclass(frozen=True)
class CellChange:
    """One cell at the multiple: its primary metric there and the paired change from its finals."""

    cell: str
    at_multiple: Interval
    change: Difference  # mean of (at multiple - final) over the seeds both completed, paired t interval


@dataclass(frozen=True)
class BudgetCheck:
    """The budget check of one table at one multiple."""

    multiple: int
    iterations: int  # per training run at the multiple
    metric: str
    changes: dict[str, CellChange]
    ranks: dict[str, int]  # the leaderboard's ranking, over the cells both rankings hold
    ranks_at_multiple: dict[str, int]
    tau: float
    missing: list[str] = field(default_factory=list)  # ranked cells with no completed seed at the multiple
    fewest: int = 0  # the shortest run at the multiple: under early stopping each cell's finals' length x it
    # what the check cost, from rows that name their device (budget_check.csv since it has the column):
    # every row at the multiple, failed ones too (they trained), and the devices they trained on
    devices: tuple[str, ...] = ()
    iterations_trained: float = math.nan
    device_s: float = math.nan

    def cost(self) -> str:
        """What the check cost (iterations, device-seconds, devices), or `` when its rows name no device."""
        if not self.devices:
            return ""
        return (
            f"the budget check at {self.multiple}x trained {self.iterations_trained:,.0f} iterations in "
            f"{self.device_s:,.0f} device-seconds ({self.device_s / 3600:.2f} device-hours) on "
            f"{'; '.join(self.devices)}"
        )

    @property
    def moved(self) -> list[str]:
        """Cells whose rank differs at the multiple, in the leaderboard's order."""
        return moved(self.ranks, self.ranks_at_multiple)

    @property
    def complete(self) -> bool:
        return not self.missing

    @property
    def stable(self) -> bool:
        """The whole ranking held: every ranked cell checked, none moved."""
        return self.complete and not self.moved

    def describe_moves(self) -> str:
        """`a (rank 2 to 3), b (rank 3 to 2)`, or `none`."""
        return ", ".join(f"{c} (rank {self.ranks[c]} to {self.ranks_at_multiple[c]})" for c in self.moved) or "none"

    def summary(self) -> str:
        """One sentence: the multiple, tau, the cells that moved and those the check lacks."""
        tau = f"{self.tau:.2f}" if math.isfinite(self.tau) else "undefined (fewer than 2 cells)"
        length = f"{self.iterations:,} iterations a run"
        if 0 < self.fewest < self.iterations:  # early stopping: the multiple of what each cell's finals trained
            length = f"{self.fewest:,}-{self.iterations:,} iterations a run, {self.multiple}x each cell's finals"
        text = (
            f"at {self.multiple}x the budget ({length}, the same final seeds), "
            f"Kendall's tau between the rankings of {self.metric} is {tau}; cells that moved: "
            f"{self.describe_moves()}"
        )
        if self.missing:
            text += f"; not checked (no completed seed at {self.multiple}x): {', '.join(self.missing)}"
        return text


def ranking(means: dict[str, float]) -> dict[str, int]:
    """Rank 1 for the highest mean; ties (and NaN, ranked last) by cell id: the leaderboard's own order."""

    def key(cell: str) -> tuple[float, str]:
        m = means[cell]
        return (-m if math.isfinite(m) else math.inf, cell)

    return {cell: i + 1 for i, cell in enumerate(sorted(means, key=key))}


def kendall_tau(ranks: dict[str, int], other: dict[str, int]) -> float:
    """Kendall's tau between two rankings of the same cells; NaN with fewer than two cells."""
    cells = sorted(ranks)
    if len(cells) < 2:
        return math.nan
    return float(kendalltau([ranks[c] for c in cells], [other[c] for c in cells]).statistic)


def moved(ranks: dict[str, int], other: dict[str, int]) -> list[str]:
    """The cells whose rank differs between the two rankings, in the first ranking's order."""
    return [c for c in sorted(ranks, key=ranks.__getitem__) if other.get(c) != ranks[c]]


def rows_at(res: Results, multiple: int) -> pd.DataFrame:
    """The completed budget-check rows at ``multiple`` (refused cells excluded), like `Results.complete`."""
    frame = res.budget_check
    if frame is None or frame.empty:
        return pd.DataFrame()
    rows = frame[pd.to_numeric(frame["multiple"], errors="coerce") == multiple]
    if "state" in rows:
        rows = rows[rows["state"].astype(str) == "COMPLETE"]
    if "params" in rows and "params" in res.finals:  # a row of other parameters checks another configuration
        ran = res.finals.groupby(res.finals["cell"].astype(str))["params"].first()
        mine = rows["cell"].astype(str).map(ran)
        rows = rows[
            ~(
                rows["params"].map(lambda p: isinstance(p, str))
                & mine.map(lambda p: isinstance(p, str))
                & (rows["params"] != mine)
            )
        ]
    return res.unrefused(rows)


def multiples(res: Results) -> list[int]:
    """The multiples recorded, ascending."""
    frame = res.budget_check
    if frame is None or frame.empty:
        return []
    return sorted({int(m) for m in pd.to_numeric(frame["multiple"], errors="coerce").dropna()})


def check(res: Results, multiple: int | None = None) -> BudgetCheck | None:
    """The budget check of ``res`` at ``multiple`` (default: the largest recorded); None when none ran."""
    recorded = multiples(res)
    if not recorded:
        return None
    multiple = recorded[-1] if multiple is None else multiple
    at = rows_at(res, multiple)
    metric = res.primary
    base = {c: float(np.nanmean(res.values(c, metric))) if len(res.values(c, metric)) else math.nan for c in res.cells}
    changes: dict[str, CellChange] = {}
    for cell in res.cells:
        rows = at[at["cell"].astype(str) == cell]
        if rows.empty:
            continue
        later = dict(zip(rows["seed"].astype(int), pd.to_numeric(rows[metric], errors="coerce")))
        earlier = dict(zip(res.seeds(cell), res.values(cell, metric)))
        both = sorted(set(later) & set(earlier))
        changes[cell] = CellChange(
            cell,
            within(t_interval(list(later.values())), metric),
            paired([later[s] for s in both], [earlier[s] for s in both]),
        )
    ranked = [c for c in res.cells if c in changes]
    ranks = ranking({c: base[c] for c in ranked})
    ranks_at = ranking({c: changes[c].at_multiple.mean for c in ranked})
    lengths = pd.to_numeric(at["iterations"], errors="coerce") if len(at) else pd.Series(dtype=float)
    every = res.budget_check  # not None: a multiple was recorded
    assert every is not None
    every = every[pd.to_numeric(every["multiple"], errors="coerce") == multiple]
    named = every["device"].dropna().astype(str) if "device" in every else pd.Series(dtype=str)
    devices = tuple(sorted({d for d in named if d.strip()}))

    def total(column: str) -> float:
        return float(pd.to_numeric(every[column], errors="coerce").fillna(0).sum()) if column in every else math.nan

    return BudgetCheck(
        multiple,
        int(lengths.max()) if len(lengths) else 0,
        metric,
        changes,
        ranks,
        ranks_at,
        kendall_tau(ranks, ranks_at),
        [c for c in res.cells if c not in changes],
        int(lengths.min()) if len(lengths) else 0,
        devices,
        total("iterations") if devices else math.nan,
        total("wall_time_s") if devices else math.nan,
    )


def at_multiple(res: Results, multiple: int) -> Results:
    """The results as if the finals had been the budget check's runs: the table a claim is re-judged on.

    The floor, the manifest (so the plan and the cells' methods) and the
    validation scores are the run's: only the test metrics per seed change.
    """
    at = rows_at(res, multiple).drop(columns=["multiple"], errors="ignore").reset_index(drop=True)
    column = f"val_{res.primary}"
    if column in res.finals:  # the run's validation score, whatever the source (MLflow does not log it here)
        chosen = res.finals.groupby(res.finals["cell"].astype(str))[column].first()
        at[column] = at["cell"].astype(str).map(chosen)
    return replace(res, finals=at, summary=None, budget_check=None)
