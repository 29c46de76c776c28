"""The leaderboard as a README-ready Markdown table with its footer, and as the terminal table."""

from __future__ import annotations

from bench.reports import maximum
from bench.reports.escape import md_code, md_text
from bench.reports.leaderboard.board import Board
from bench.reports.leaderboard.cells import (
    COMPUTE_HEADS,
    NOTES,
    budget,
    budget_cells,
    budget_heads,
    compute_cells,
    floor_cells,
    fmt,
    fmt_interval,
    fmt_params,
    interval_unit,
    notes,
    split_cells,
    split_heads,
)
from bench.reports.leaderboard.footer import compute_line, footer_lines


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
    if board.ended:  # under early stopping: how many cells a maximum ended (the converged table's test)
        out.append(maximum.sentence(board.ended))
    out += [f"{r.cell}: {note}" for r in board.rows for note in r.notes]
    out += [f"{cell}: no result: {why}" for cell, why in board.missing.items()]
    if board.job:
        out.append(board.job)
    out.append(compute_line(board).replace("`", ""))
    return "\n".join(out)
