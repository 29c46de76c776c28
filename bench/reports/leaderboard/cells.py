"""The leaderboard's cells as text: numbers, intervals, budgets, the variance split and compute of one row,
shared by the Markdown, HTML and terminal tables so that each shows a number the same way."""

from __future__ import annotations

import math
from typing import Any

from bench.reports.leaderboard.board import Board, Row
from bench.stats import Difference, Interval

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
