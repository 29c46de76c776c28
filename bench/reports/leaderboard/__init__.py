"""The leaderboard: cells ranked by the primary metric, with intervals, budgets and what a reader must not miss.

* `board`: the rows collected from one results table (`build`), with the
  floor check, failed seeds, edge values, missing cells and compute;
* `cells`: one row's numbers as text, shared by every table;
* `footer`: the footer's lines (hashes, fingerprints, floor rule, budget
  check, compute);
* `render`: the Markdown table and the terminal table.
"""

from bench.reports.leaderboard.board import (
    MIN_SEEDS,
    MIN_TRANSFER,
    MIN_TRANSFER_CELLS,
    Board,
    Compute,
    Row,
    build,
)
from bench.reports.leaderboard.render import markdown, text

__all__ = [
    "MIN_SEEDS",
    "MIN_TRANSFER",
    "MIN_TRANSFER_CELLS",
    "Board",
    "Compute",
    "Row",
    "board",
    "build",
    "cells",
    "footer",
    "markdown",
    "render",
    "text",
]
