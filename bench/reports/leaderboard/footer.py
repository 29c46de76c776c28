"""The leaderboard's footer: what makes the table rerunnable and comparable (protocol hash, split
fingerprints, code, budget, floor rule) and what the sweep cost."""

from __future__ import annotations

import math

from bench.reports import floor, maximum
from bench.reports.escape import md_code, md_text
from bench.reports.leaderboard.board import Board
from bench.reports.leaderboard.cells import CLIP_NOTE, devices_text, fmt_seconds


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
    if board.ended:
        lines.append(md_text(maximum.sentence(board.ended)))
    lines.append(compute_line(board))
    extra = split_line(board)
    if extra:
        lines.append(extra)
    return lines


def compute_line(board: Board) -> str:
    """The footer's sentence on what the sweep cost, TabArena-style beside the scores."""
    c = board.compute
    if c is None:
        return "compute: not recorded"
    it = "-" if not math.isfinite(c.iterations) else f"{int(c.iterations):,}"
    hours = f" ({c.device_s / 3600:.2f} device-hours)" if math.isfinite(c.device_s) else ""
    where = devices_text(c.devices) if c.devices else "a device these tables do not record"
    b = board.budget
    check = f"; {md_text(b.cost())}" if b is not None and b.cost() else ""
    return (
        f"compute: {it} training iterations and {fmt_seconds(c.device_s)} device-seconds{hours} on "
        f"{md_text(where)}, every cell's trials and final seeds: each run's training and evaluation wall time, "
        f"summed (runs of parallel workers each counted whole; the floor and the sweep's bookkeeping are "
        f"outside it){check}"
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
