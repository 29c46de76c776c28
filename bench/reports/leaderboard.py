"""The leaderboard table: cells ranked by the primary metric, with intervals and budgets.

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

import html
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from bench.plan import trained_cell
from bench.reports import budget as budget_check
from bench.reports import edges, floor, variance
from bench.reports.source import Results
from bench.stats import Difference, Interval, spearman, t_interval, within


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


NOTES = (
    "Notes: a cell the data show at the floor (the untrained trunk) is collapsed and evidence of nothing; "
    "one not significantly above it with an interval too wide to say is not shown above the floor (more seeds "
    "decide); one above it by less than a quarter of the best cell's gain is barely trained; failed "
    "final seeds are counted with their reason; a tuned value within 5% of an end of its search range may "
    "have been cut short by the range."
)


def fmt(x: float, digits: int = 3) -> str:
    """A number to ``digits`` decimals, ``-`` for a missing or non-finite one."""
    return "-" if x is None or not math.isfinite(x) else f"{x:.{digits}f}"


def fmt_interval(iv: Interval, digits: int = 3, signed: bool = False) -> str:
    """`mean [low, high]`, or the bare mean with `(n=1)` where no interval exists; `signed`: `+mean [...]`."""
    if not math.isfinite(iv.mean):
        return "-"
    spec = f"{'+' if signed else ''}.{digits}f"
    if not iv.defined:
        return f"{iv.mean:{spec}} (n={iv.n})"
    return f"{iv.mean:{spec}} [{iv.low:{spec}}, {iv.high:{spec}}]{CLIP_MARK if iv.clipped else ''}"


def fmt_change(d: Difference, digits: int = 3) -> str:
    """A paired change as `+mean [low, high]`, or `+mean (n=1)` where no interval exists."""
    return fmt_interval(Interval(d.diff, d.low, d.high, d.n_a), digits, signed=True)


def budget_heads(board: Board) -> list[str]:
    """The budget check's column heads (none without a check): the primary metric at the multiple, its change
    from the finals, and the cell's rank at the multiple."""
    b = board.budget
    return (
        [] if b is None else [f"{board.primary} at {b.multiple}x", f"change at {b.multiple}x", f"rank at {b.multiple}x"]
    )


def budget_cells(board: Board, row: Row, digits: int = 3) -> list[str]:
    """A row's budget check cells, `-` for a cell the check has no completed seed of."""
    b = board.budget
    if b is None:
        return []
    change = b.changes.get(row.cell)
    if change is None:
        return ["-", "-", "-"]
    rank = b.ranks_at_multiple.get(row.cell)
    return [
        fmt_interval(change.at_multiple, digits),
        fmt_change(change.change, digits),
        "-" if rank is None else str(rank),
    ]


def budget_line(board: Board) -> str:
    """The footer's sentence on the budget check, or on its absence."""
    b = board.budget
    if b is None:
        return (
            "no budget check: whether this ranking holds when every cell trains longer is unknown "
            "(`dmlbench budget-check`)"
        )
    return (
        f"budget check: {md_text(b.summary())}. Change: the mean over seeds of (the run at {b.multiple}x minus "
        "the final of the same seed), with its paired 95% t-interval"
    )


CLIP_MARK = "*"
CLIP_NOTE = (
    f"{CLIP_MARK} interval clipped to the metric's range ([0, 1]; AMI only at 1): the t interval "
    "reached beyond a value any run can take"
)


def fmt_params(params: dict[str, Any]) -> str:
    """Tuned hyperparameters as sorted ``name=value`` (floats to 4 significant digits), ``-`` when none."""
    parts = []
    for k, v in sorted(params.items()):
        parts.append(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}")
    return ", ".join(parts) or "-"


def budget(row: Row) -> str:
    """Trials, then the iterations and samples the cell used in all (tuning and final seeds)."""
    it = "-" if not math.isfinite(row.total_iterations) else f"{int(row.total_iterations):,}"
    seen = "-" if not math.isfinite(row.total_samples) else f"{int(row.total_samples):,}"
    return f"{row.trials} trials ({row.trials_complete} complete); {it} iterations, {seen} samples"


def md_code(text: object) -> str:
    """`text` as a Markdown code span no content can end: cell names and paths come from files a user may not trust.

    The fence is one backtick longer than the longest run inside (CommonMark),
    so a backtick in a crafted cell name cannot close the span and let raw
    HTML (``<img onerror=...>``) out; newlines become spaces and ``|`` is
    escaped so a table row stays one row.
    """
    body = " ".join(str(text).splitlines()).replace("|", "\\|")
    runs = [len(m) for m in re.findall(r"`+", body)]
    fence = "`" * (max(runs, default=0) + 1)
    pad = " " if body.startswith("`") or body.endswith("`") or runs else ""
    return f"{fence}{pad}{body}{pad}{fence}"


def md_text(text: object) -> str:
    """Free text (a claim's statement, a refusal reason) as inert Markdown: no raw HTML, one table cell, one line.

    Backticks are kept (reasons and statements quote names as code); with
    ``<``, ``>`` and ``&`` escaped, a code span can show markup but never run it.
    """
    return html.escape(" ".join(str(text).splitlines()), quote=False).replace("|", "\\|")


def interval_unit(board: Board) -> str:
    """What the intervals are over: the seeds, or under tuning.repeats the tuning draws' means."""
    b = board.manifest.get("budget")
    draws = b.get("draws") if isinstance(b, dict) else None
    if isinstance(draws, int) and draws > 1:
        return (
            f"over the means of {draws} independent tuning draws, each its winner's mean over the final seeds "
            "(tuning.repeats: the tuning's own noise included)"
        )
    return "over seeds"


def footer_lines(board: Board) -> list[str]:
    """What makes the table rerunnable and comparable: protocol hash, split fingerprints, code."""
    m = board.manifest
    lines = [
        f"protocol {md_code(board.protocol)}, hash {md_code(board.protocol_hash)}",
        f"primary metric {md_code(board.primary)}",
    ]
    for name, digest in board.fingerprints.items():
        lines.append(f"{md_text(name)} fingerprint {md_code(digest)}")
    if board.job:
        lines.append(md_text(board.job))
    b = m.get("budget")
    if isinstance(b, dict) and b:
        lines.append("budget per cell: " + ", ".join(f"{k} {v}" for k, v in b.items()))
    for key, label in (
        ("source", "read from"),
        ("git_commit", "git commit"),
        ("created", "created"),
        ("finished", "finished"),
    ):
        if m.get(key):
            lines.append(f"{label} {md_text(m[key])}" + (_wall(board) if key == "finished" else ""))
    if m.get("git_dirty"):
        lines.append("the working tree had uncommitted changes")
    refused = m.get("refused") or {}
    for cell, why in refused.items() if isinstance(refused, dict) else []:
        lines.append(f"left out (budget audit): {md_code(cell)}: {md_text(why)}")
    if board.floor:
        collapsed = [r.cell for r in board.rows if r.collapsed]
        unresolved = [r.cell for r in board.rows if r.not_shown_above]
        lines.append(
            f"floor: the untrained trunk evaluated the same way, one run per final seed; a cell is marked "
            f"collapsed when its {md_code(board.primary)} is not significantly above it (one-sided, "
            f"alpha {floor.ALPHA:g}, paired by seed when the seeds match, else Welch) and its interval rules "
            f"out {floor.WEAK_SHARE:.0%} of the best cell's gain: "
            + (", ".join(md_code(c) for c in collapsed) or "none")
            + "; not shown above the floor (not significant, interval too wide to say): "
            + (", ".join(md_code(c) for c in unresolved) or "none")
            + f"; barely trained (above it by less than {floor.WEAK_SHARE:.0%} of the best cell's gain): "
            + (
                ", ".join(md_code(r.cell) for r in board.rows if r.floor_check is not None and r.floor_check.weak)
                or "none"
            )
        )
    else:
        lines.append(
            "no floor row: these results have no floor.csv (the untrained trunk was not evaluated), "
            "so no cell can be marked collapsed"
        )
    if board.clipped:
        lines.append(CLIP_NOTE)
    if not board.edges_known:
        lines.append(
            "tuned values not checked against their search ranges: the protocol file with this hash was not found"
        )
    lines.append(budget_line(board))
    lines.append(compute_line(board))
    extra = split_line(board)
    if extra:
        lines.append(extra)
    return lines


def floor_cells(board: Board, digits: int = 3) -> list[str]:
    """The floor row's metric cells, in the board's metric order."""
    return [fmt_interval(board.floor[m], digits) for m in board.metrics]


def notes(row: Row) -> str:
    """A row's notes in one cell, ``-`` when none."""
    return "; ".join(row.notes) or "-"


def split_heads(board: Board) -> list[str]:
    """The variance split's column heads under tuning.repeats (none otherwise)."""
    return [f"s_t ({board.primary})", "s_e", "tuning share"] if board.draws else []


def split_cells(board: Board, row: Row) -> list[tuple[str, float]]:
    """A row's tuning SD, seed SD and tuning share (text, raw value), `-` where it has no split."""
    if not board.draws:
        return []
    s = row.split
    if s is None:
        return [("-", math.nan)] * 3
    share = "-" if not math.isfinite(s.share) else f"{s.share:.0%}"
    if math.isfinite(s.share_low) and math.isfinite(s.share_high):
        share += f" [{s.share_low:.0%}, {s.share_high:.0%}]"
    return [(fmt(s.tuning_sd, 4), s.tuning_sd), (fmt(s.seed_sd, 4), s.seed_sd), (share, s.share)]


COMPUTE_HEADS = ["device-s", "device"]


def fmt_seconds(x: float) -> str:
    """Seconds as a whole number with thousands separators, `-` when unknown."""
    return "-" if not math.isfinite(x) else f"{x:,.0f}"


def devices_text(devices: tuple[str, ...]) -> str:
    return "; ".join(devices) or "-"


def compute_cells(row: Row) -> list[tuple[str, Any]]:
    """A row's device-seconds and device (text, raw value)."""
    return [(fmt_seconds(row.device_s), row.device_s), (devices_text(row.devices), devices_text(row.devices))]


def compute_line(board: Board) -> str:
    """The footer's sentence on what the sweep cost, TabArena-style beside the scores."""
    c = board.compute
    if c is None:
        return "compute: not recorded"
    it = "-" if not math.isfinite(c.iterations) else f"{int(c.iterations):,}"
    hours = f" ({c.device_s / 3600:.2f} device-hours)" if math.isfinite(c.device_s) else ""
    where = devices_text(c.devices) if c.devices else "a device these tables do not record"
    return (
        f"compute: {it} training iterations and {fmt_seconds(c.device_s)} device-seconds{hours} on "
        f"{md_text(where)}, every cell's trials and final seeds: each run's training and evaluation wall time, "
        "summed (runs of parallel workers each counted whole; the floor and the sweep's bookkeeping are "
        "outside it)"
    )


def _wall(board: Board) -> str:
    """The last worker's wall clock (the manifest's time accounting), beside when it finished."""
    c = board.compute
    if c is None or not math.isfinite(c.wall_s):
        return ""
    return f" (the last worker's wall clock: {fmt_seconds(c.wall_s)} s, the floor and bookkeeping included)"


def split_line(board: Board) -> str | None:
    """The footer's sentence on the variance split, under tuning.repeats."""
    if not board.draws:
        return None
    return (
        f"variance split of {md_code(board.primary)} over the tuning draws (one-way random-effects ANOVA, "
        "docs/METHODS.md, What a verdict costs): s_e the pooled SD of the final seeds within a draw, s_t the "
        "tuning draws' SD beyond it (max(0, var(draw means) - s_e^2/S)), tuning share s_t^2/(s_t^2 + s_e^2) "
        "with its 95% F interval; `dmlbench power` turns them into the seeds and draws a claim needs"
    )


def markdown(board: Board) -> str:
    """A README-ready Markdown table with the protocol footer."""
    head = [
        "rank",
        "cell",
        "seeds",
        *board.metrics,
        *budget_heads(board),
        *split_heads(board),
        f"val_{board.primary}",
        "budget",
        *COMPUTE_HEADS,
        "tuned hyperparameters",
        "notes",
    ]
    out = [
        f"## dmlbench leaderboard: {md_text(board.protocol)}",
        "",
        f"Cells ranked by mean test {md_code(board.primary)} over final seeds; "
        f"each metric as mean [95% t-interval {interval_unit(board)}]. " + NOTES,
        "",
        "| " + " | ".join(head) + " |",
        "| " + " | ".join("---:" if h in ("rank", "seeds") else "---" for h in head) + " |",
    ]
    for r in board.rows:
        cells = [
            str(r.rank),
            md_code(r.cell),
            str(r.n_seeds),
            *(fmt_interval(r.metrics[m]) for m in board.metrics),
            *budget_cells(board, r),
            *(text for text, _ in split_cells(board, r)),
            fmt(r.validation),
            budget(r),
            *(md_text(text) for text, _ in compute_cells(r)),
            md_text(fmt_params(r.params)),
            md_text(notes(r)),
        ]
        out.append("| " + " | ".join(cells) + " |")
    for cell, why in board.missing.items():
        out.append(
            "| "
            + " | ".join(
                [
                    "-",
                    md_code(cell),
                    "0",
                    *("-" for _ in board.metrics),
                    *("-" for _ in budget_heads(board)),
                    *("-" for _ in split_heads(board)),
                    "-",
                    "-",
                    *("-" for _ in COMPUTE_HEADS),
                    "-",
                    md_text(f"no result: {why}"),
                ]
            )
            + " |"
        )
    if board.floor:
        n = max(iv.n for iv in board.floor.values())
        out.append(
            "| "
            + " | ".join(
                [
                    "floor",
                    "untrained trunk",
                    str(n),
                    *floor_cells(board),
                    *("-" for _ in budget_heads(board)),
                    *("-" for _ in split_heads(board)),
                    "-",
                    "-",
                    *("-" for _ in COMPUTE_HEADS),
                    "-",
                    "the same trunk before training",
                ]
            )
            + " |"
        )
    out += [line for w in board.warnings for line in ("", f"> **Warning:** {w}")]  # right under the table
    out += ["", "---", ""]
    out += [f"- {line}" for line in footer_lines(board)]
    out.append(f"- validation/test rank correlation (Spearman) of {md_code(board.primary)}: {fmt(board.transfer, 2)}")
    return "\n".join(out) + "\n"


def text(board: Board, columns: tuple[str, ...] = ("precision_at_1", "lake_accuracy")) -> str:
    """A terminal table: rank, cell, seeds, primary metric with its interval, a few more means, validation.

    What `dmlbench run` prints when it finishes; the full table with every
    metric and the budgets is the Markdown one (`dmlbench leaderboard`).
    """
    extra = [m for m in columns if m in board.metrics and m != board.primary]
    checked = budget_heads(board)[1:2]  # the change at the multiple
    head = ["rank", "cell", "seeds", f"{board.primary} [95% CI]", *extra, *checked, f"val_{board.primary}"]
    rows = [
        [
            str(r.rank),
            r.cell + r.mark,
            str(r.n_seeds),
            fmt_interval(r.metrics[board.primary]),
            *(fmt(r.metrics[m].mean) for m in extra),
            *budget_cells(board, r)[1:2],
            fmt(r.validation),
        ]
        for r in board.rows
    ]
    rows += [
        ["-", f"{cell} (no result)", "0", "-", *("-" for _ in extra), *("-" for _ in checked), "-"]
        for cell in board.missing
    ]
    if board.floor:
        rows.append(
            [
                "floor",
                "untrained trunk",
                str(board.floor[board.primary].n),
                fmt_interval(board.floor[board.primary]),
                *(fmt(board.floor[m].mean) for m in extra),
                *("-" for _ in checked),
                "-",
            ]
        )
    widths = [max(len(line[i]) for line in [head, *rows]) for i in range(len(head))]

    def line(cells: list[str]) -> str:
        return "  ".join(c.ljust(w) if i == 1 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    out = [
        *(f"warning: {w}" for w in board.warnings),
        line(head),
        line(["-" * w for w in widths]),
        *(line(r) for r in rows),
    ]
    refused = board.manifest.get("refused") or {}
    out += [f"left out (budget audit): {cell}: {why}" for cell, why in refused.items()]
    if board.budget is not None and board.budget.stable:  # an unstable one is the warning above the table
        out.append(f"budget check: {board.budget.summary()}")
    out += [f"{r.cell}: {note}" for r in board.rows for note in r.notes]
    out += [f"{cell}: no result: {why}" for cell, why in board.missing.items()]
    if board.job:
        out.append(board.job)
    out.append(compute_line(board).replace("`", ""))
    return "\n".join(out)
