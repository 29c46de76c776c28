"""The leaderboard's rows: each cell's intervals, budgets, floor check and notes, collected from one results table.

Means and intervals are recomputed here from the per-seed rows of
`finals.csv` rather than copied from `summary.csv`, so the leaderboard, the
regression check and the claims all rest on the same numbers and the same
interval (`bench.stats.t_interval`).

Beside the ranks the board states what a reader must not miss: the floor
(the untrained trunk, `bench.reports.floor`) as its own row and each cell
that is not significantly above it marked collapsed; failed final seeds
with their count and reason (a cell is never silently reported on fewer
seeds); tuned values at the edge of their search range (`bench.reports.edges`).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from bench.plan import trained_cell
from bench.reports import budget as budget_check
from bench.reports import edges, floor, maximum, variance
from bench.reports.source import Results
from bench.stats import Interval, spearman, t_interval, within


@dataclass(frozen=True)
class Row:
    """One cell of the leaderboard."""

    rank: int
    cell: str
    n_seeds: int
    metrics: dict[str, Interval]
    validation: float
    iterations: float  # per final training run
    total_iterations: float  # tuning and finals together: the cell's whole budget as used
    total_samples: float
    trials: int
    trials_complete: int
    wall_time_s: float
    params: dict[str, Any] = field(default_factory=dict)
    failed: dict[int, str] = field(default_factory=dict)  # final seed -> reason, for seeds that did not finish
    floor_check: floor.FloorCheck | None = None
    edge_warnings: list[str] = field(default_factory=list)
    device_s: float = math.nan  # wall seconds of training and evaluation, every trial and final seed summed
    devices: tuple[str, ...] = ()  # the hardware its runs recorded (`bench.devices.describe`); empty: not recorded
    split: variance.Split | None = None  # under tuning.repeats: the primary metric's tuning and seed noise
    searched: bool = True  # False: the cell searched nothing (its trials differ by seed alone, or it had one)
    ended: maximum.Ended | None = None  # under early stopping: whether a maximum, not patience, ended its tuning

    @property
    def collapsed(self) -> bool:
        return bool(self.floor_check is not None and self.floor_check.collapsed)

    @property
    def not_shown_above(self) -> bool:
        """Not significantly above the floor, with too few seeds or too much noise to call it collapsed."""
        return bool(self.floor_check is not None and self.floor_check.unresolved)

    @property
    def mark(self) -> str:
        """What the cell's name carries in the short table: collapsed, or not shown above the floor."""
        if self.collapsed:
            return " (collapsed)"
        return f" (not shown above the floor, {self.n_seeds} seeds)" if self.not_shown_above else ""

    @property
    def notes(self) -> list[str]:
        """What the reader must see beside the numbers: collapse, failed seeds, edge values."""
        out = []
        if self.floor_check is not None and (self.floor_check.below is not False or self.floor_check.weak):
            out.append(self.floor_check.describe())
        if self.failed:
            reasons = "; ".join(f"seed {s}: {why or 'no reason recorded'}" for s, why in sorted(self.failed.items()))
            out.append(f"{len(self.failed)} final seed(s) failed ({reasons})")
        out += [f"edge: {w}" for w in self.edge_warnings]
        if self.ended is not None and (self.ended.hit or self.ended.unknown):
            out.append(self.ended.describe())
        if not self.searched:
            out.append(
                "nothing searched: one tuning trial"
                if self.trials <= 1
                else f"nothing searched: its {self.trials} trials differ by seed alone (validation: the best seed's)"
            )
        return out


@dataclass(frozen=True)
class Board:
    """Rows in rank order plus the facts the footer must state."""

    protocol: str
    protocol_hash: str
    primary: str
    metrics: list[str]
    rows: list[Row]
    fingerprints: dict[str, str]
    manifest: dict[str, Any]
    floor: dict[str, Interval] = field(default_factory=dict)  # per metric; empty when no floor was run
    edges_known: bool = True  # False when the protocol could not be re-planned (no search ranges to check)
    budget: budget_check.BudgetCheck | None = None  # the cells retrained at a multiple of the budget, if checked
    missing: dict[str, str] = field(default_factory=dict)  # planned cells without a result -> why
    compute: Compute | None = None  # the sweep's total cost, every cell's runs
    ended: dict[str, maximum.Ended] = field(default_factory=dict)  # under early stopping: how each cell ended

    @property
    def draws(self) -> bool:
        """Whether the results repeated their tuning (tuning.repeats): the rows then carry the variance split."""
        return any(r.split is not None for r in self.rows)

    @property
    def transfer(self) -> float:
        """Spearman correlation of validation and test primary metric across cells (tuning transfer)."""
        return spearman([r.validation for r in self.rows], [r.metrics[self.primary].mean for r in self.rows])

    @property
    def job(self) -> str | None:
        """For a job of a split sweep (`run --cells`), which part of the plan it holds; None otherwise."""
        m = self.manifest
        planned = m.get("planned_cells")
        if not isinstance(planned, list) or "merged_from" in m or not isinstance(m.get("cells"), list):
            return None
        return (
            f"a job of {len(m['cells'])} of the {len(planned)} planned cells (run --cells); the others are other "
            "jobs', and `dmlbench merge` joins them"
        )

    @property
    def warnings(self) -> list[str]:
        """What makes the table mean less than it seems; shown above it (Markdown, HTML and terminal).

        With fewer than 3 final seeds a t interval rests on 1 or 2 degrees of
        freedom (or is absent); a validation/test rank correlation below 0.5
        means the tuning ranks cells differently from the test, so the tuned
        values say little about the test ranking.
        """
        out = []
        if self.missing:
            out.append(
                f"{len(self.missing)} planned cell(s) have no result ({', '.join(self.missing)}): the "
                "comparison is incomplete, and the rows below say why"
            )
        seeds = [r.n_seeds for r in self.rows]
        if seeds and min(seeds) < MIN_SEEDS:
            out.append(
                f"only {min(seeds)} final seed(s) in some cells (fewer than {MIN_SEEDS}): "
                "the intervals are wide or missing, and the ranking may not hold"
            )
        if self.budget is not None and not self.budget.stable:
            head = (
                "the ranking is not stable when every cell trains longer: "
                if self.budget.moved
                else "the ranking is not yet shown stable when every cell trains longer (the budget check is "
                "incomplete): "
            )
            out.append(head + self.budget.summary() + ". This ranking may not be the one the methods converge to")
        hit = [e.cell for e in self.ended.values() if e.hit]
        if hit:
            out.append(
                f"{len(hit)} of {len(self.ended)} cells were ended by a training maximum, not by early stopping "
                f"({', '.join(hit)}): the maximum, not their validation score, bounded how long they trained, so "
                "the table may not be converged there"
                + ("" if self.budget is None else "; the budget check shows what twice their length gives")
            )
        rho = self.transfer
        if math.isfinite(rho) and rho < MIN_TRANSFER and len(self.rows) >= MIN_TRANSFER_CELLS:
            out.append(
                f"validation/test rank correlation (Spearman) of {self.primary} is {rho:.2f}, below "
                f"{MIN_TRANSFER}: the cells' validation scores do not predict their test ranking, so tuning "
                "results mean little here"
            )
        return out

    @property
    def clipped(self) -> bool:
        """Whether any printed interval was clipped to its metric's range."""
        rows = [iv for r in self.rows for iv in r.metrics.values()] + list(self.floor.values())
        return any(iv.clipped for iv in rows)


@dataclass(frozen=True)
class Compute:
    """What a sweep cost: iterations and device-seconds of every trial and final seed, the hardware they
    recorded, and the last worker's wall clock from the manifest's time accounting (NaN when absent)."""

    iterations: float
    device_s: float
    devices: tuple[str, ...]
    wall_s: float = math.nan


def _devices(*frames: pd.DataFrame | None) -> tuple[str, ...]:
    """The distinct devices the rows of ``frames`` recorded, sorted (none for tables without the column)."""
    found: set[str] = set()
    for f in frames:
        if f is not None and "device" in f:
            found |= {str(d) for d in f["device"].dropna() if str(d).strip()}
    return tuple(sorted(found))


def _compute(res: Results) -> Compute:
    """The sweep's totals from its tables: every trial, and every final seed once (a final.mode folds seed has
    two rows, one per reported evaluation, and one training)."""
    trials = res.trials if res.trials is not None and not res.trials.empty else None
    finals = res.finals.assign(cell=res.finals["cell"].astype(str).map(trained_cell))
    key = [c for c in ("cell", "draw", "seed") if c in finals]
    finals = finals.drop_duplicates(key) if "seed" in finals else finals

    def total(col: str) -> float:
        parts = [f[col] for f in (trials, finals) if f is not None and col in f]
        return float(sum(pd.to_numeric(p, errors="coerce").fillna(0).sum() for p in parts)) if parts else math.nan

    timing = res.manifest.get("time")
    wall = timing.get("wall_s") if isinstance(timing, dict) else None
    devices = _devices(trials, finals)
    if not devices and res.plan is not None:  # tables without the column: the protocol's device, model unknown
        devices = (f"{res.plan.protocol.spec.training.device} (model not recorded)",)
    return Compute(
        total("iterations"),
        total("wall_time_s"),
        devices,
        float(wall) if isinstance(wall, (int, float)) else math.nan,
    )


MIN_SEEDS = 3  # fewer final seeds get a warning on the leaderboard
MIN_TRANSFER = 0.5  # a lower validation/test Spearman gets a warning...
MIN_TRANSFER_CELLS = 6  # ...on a table of this many cells: with fewer, one swapped pair moves it by 0.3 or more


def _params(text: Any) -> dict[str, Any]:
    if isinstance(text, dict):
        return text
    if not isinstance(text, str) or not text.strip():
        return {}
    try:
        value = json.loads(text)
    except ValueError:
        return {"params": text}
    return value if isinstance(value, dict) else {"params": value}


def _first_number(rows: pd.DataFrame, col: str) -> float:
    if col not in rows or rows[col].dropna().empty:
        return math.nan
    return float(rows[col].dropna().iloc[0])


def build(res: Results) -> Board:
    """Rank cells by the mean of the primary metric over seeds (highest first; ties by cell id)."""
    metrics = res.metrics
    primary = res.primary
    trials = res.trials if res.trials is not None and not res.trials.empty else None
    unranked: list[Row] = []
    plan = res.plan
    ends = maximum.ended(res)
    for cell in res.reported_cells:
        rows = res.rows(cell)
        fail = res.failed(cell)
        every = res.finals[res.finals["cell"].astype(str) == cell]  # failed seeds used budget too
        if trials is not None and "cell" in trials:
            t = trials[trials["cell"].astype(str) == trained_cell(cell)]  # a final.mode folds row: its cell's
            n_trials = len(t)
            n_complete = int((t["state"].astype(str) == "COMPLETE").sum()) if "state" in t else n_trials
        else:
            t, n_trials, n_complete = None, 0, 0

        src = rows if len(rows) else every
        params = _params(src["params"].iloc[0]) if "params" in src else {}

        def total(col: str, t: Any = t, every: Any = every) -> float:
            parts = [frame[col] for frame in (t, every) if frame is not None and col in frame]
            return float(sum(p.fillna(0).sum() for p in parts)) if parts else math.nan

        unranked.append(
            Row(
                rank=0,
                cell=cell,
                n_seeds=len(rows),
                # over seeds, or under tuning.repeats over the tuning draws' means (`Results.values`)
                metrics={m: within(t_interval(res.values(cell, m) if len(rows) else []), m) for m in metrics},
                validation=_first_number(rows, f"val_{primary}"),
                iterations=_first_number(rows, "iterations"),
                total_iterations=total("iterations"),
                total_samples=total("samples_seen"),
                trials=n_trials,
                trials_complete=n_complete,
                wall_time_s=float(rows["wall_time_s"].sum()) if "wall_time_s" in rows else math.nan,
                params=params,
                failed={
                    int(r["seed"]) if "seed" in fail else i: _reason(r.get("reason"))
                    for i, (_, r) in enumerate(fail.iterrows())
                },
                floor_check=floor.check(res, cell),
                edge_warnings=_edges(plan, cell, params),
                device_s=total("wall_time_s"),
                devices=_devices(t, every),
                split=variance.cell_split(res, cell, primary) if res.draws and len(rows) else None,
                searched=_searched(plan, cell),
                ended=ends.get(trained_cell(cell)),
            )
        )

    def key(r: Row) -> tuple[float, str]:
        m = r.metrics[primary].mean if primary in r.metrics else math.nan
        return (-m if math.isfinite(m) else math.inf, r.cell)

    ranked = [Row(**{**r.__dict__, "rank": i + 1}) for i, r in enumerate(sorted(unranked, key=key))]
    floor_row = {m: within(t_interval(res.floor_values(m)[0]), m) for m in metrics} if res.floor is not None else {}
    return Board(
        res.protocol,
        res.protocol_hash,
        primary,
        metrics,
        ranked,
        res.fingerprints,
        res.manifest,
        floor_row,
        plan is not None,
        budget_check.check(res),
        _missing(res, trials),
        _compute(res),
        ends,
    )


def _missing(res: Results, trials: pd.DataFrame | None) -> dict[str, str]:
    """Cells the plan holds (or the trials name) with no final row, each with why: a cell never vanishes."""
    reported = {trained_cell(c) for c in res.reported_cells}  # final.mode folds: two rows of one cell
    asked = res.asked_cells  # a job of `run --cells`: the cells it was asked for (`Results.asked_cells`)
    planned = asked if asked is not None else [c.id for c in res.plan.cells] if res.plan is not None else []
    tried = list(dict.fromkeys(trials["cell"].astype(str))) if trials is not None and "cell" in trials else []
    given = res.manifest.get("not_run")
    not_run: dict[str, Any] = given if isinstance(given, dict) else {}
    out: dict[str, str] = {}
    for cell in dict.fromkeys([*planned, *tried, *res.refused]):
        if cell in reported:
            continue
        if cell in not_run:  # a merged folder's planned cell that no job ran
            out[cell] = f"not run: {not_run[cell]}"
            continue
        if cell in res.refused:
            out[cell] = f"left out by the budget audit: {res.refused[cell]}"
            continue
        t = trials[trials["cell"].astype(str) == cell] if trials is not None and "cell" in trials else None
        if t is None or t.empty:
            out[cell] = "not run: no trial or final seed is recorded"
            continue
        states = t["state"].astype(str) if "state" in t else pd.Series(dtype=str)
        reasons = [_reason(r) for r in t.get("reason", []) if _reason(r)]
        first = f" (first: {reasons[0]})" if reasons else ""
        if not (states == "COMPLETE").any():
            out[cell] = f"every trial failed: {len(t)} of {len(t)}{first}"
        else:
            out[cell] = "no final seed is recorded (the run was interrupted, or the finals have not started)"
    return out


def _reason(value: Any) -> str:
    return "" if value is None or (isinstance(value, float) and math.isnan(value)) else str(value).strip()


def _edges(plan: Any, cell: str, params: dict[str, Any]) -> list[str]:
    if plan is None:
        return []
    try:
        space = plan.cell(cell).search_space
    except KeyError:
        return []
    return edges.warnings(params, space)


def _searched(plan: Any, cell: str) -> bool:
    """Whether the cell's trials searched anything (True when the protocol could not be re-planned)."""
    if plan is None:
        return True
    try:
        return bool(plan.cell(cell).search_space)
    except KeyError:
        return True
