"""The leaderboard as one self-contained HTML page: sortable table and inline SVG charts.

Self-contained means the file opens from disk with no network: styles,
script and charts are inline, and nothing is fetched. Reading the artifact
files is kept apart (`collect`) from rendering (`render`, a pure function of
the board and the arrays) so the page can be tested without a browser and
rendered from any source of tables.
"""

from __future__ import annotations

import math
import zipfile
from dataclasses import dataclass, field
from html import escape
from pathlib import Path

import numpy as np
import pandas as pd

from bench.errors import BenchError
from bench.plan import trained_cell
from bench.reports import svg
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
from bench.reports.leaderboard.footer import footer_lines
from bench.reports.source import Results
from bench.sweep import tables

BEST_CELLS = 3  # distance distributions are drawn for this many top cells
MAX_EMBEDDINGS = 12  # 2-D embeddings (a 2-D protocol has few cells): the top ones, at most this many


@dataclass(frozen=True)
class Artifacts:
    """Arrays read from `artifacts/<cell>/` and the tuning history of each cell."""

    pair_distances: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    embeddings: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    history: dict[str, pd.DataFrame] = field(default_factory=dict)


def _npz(path: Path, keys: tuple[str, str]) -> tuple[np.ndarray, np.ndarray]:
    try:
        # the file opened here, not by np.load: numpy leaves its own handle open when the archive is unreadable
        with open(path, "rb") as fh:
            z = np.load(fh)
            if not isinstance(z, np.lib.npyio.NpzFile):
                raise ValueError("not an .npz archive")
            with z:
                return tuple(np.asarray(z[k]) for k in keys)  # type: ignore[return-value]
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as e:
        raise BenchError(f"{path}: unreadable artifact, expected arrays {', '.join(keys)} ({e})") from None


def _history_csv(path: Path) -> pd.DataFrame:
    """A cell's optuna_history.csv; a file a run did not write (garbage, other columns) is one line."""
    columns = ("trial", "value", "best_so_far")
    try:
        frame = pd.read_csv(path)
    except (OSError, ValueError, UnicodeDecodeError) as e:
        raise BenchError(f"{path}: unreadable Optuna history ({str(e).splitlines()[0]})") from None
    missing = [c for c in columns if c not in frame]
    if missing:
        raise BenchError(f"{path}: not an Optuna history: no column {', '.join(missing)}")
    return frame


def _history_from_trials(trials: pd.DataFrame | None, cell: str) -> pd.DataFrame | None:
    """Optuna history from trials.csv when a cell has no optuna_history.csv."""
    if trials is None or trials.empty or "cell" not in trials:
        return None
    t = trials[trials["cell"].astype(str) == trained_cell(cell)].sort_values("trial")
    if t.empty:
        return None
    value = pd.to_numeric(t["value"], errors="coerce")
    ok = value.where(t["state"].astype(str) == "COMPLETE") if "state" in t else value
    return pd.DataFrame(
        {"trial": t["trial"].to_numpy(), "value": value.to_numpy(), "best_so_far": ok.cummax().to_numpy()}
    )


def collect(res: Results, board: Board) -> Artifacts:
    """Read the artifacts the page draws: the best cells' arrays and every cell's history."""
    best = [r.cell for r in board.rows[:BEST_CELLS]]
    pairs: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    embs: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    hist: dict[str, pd.DataFrame] = {}
    for cell in best:
        p = res.artifact(cell, tables.PAIR_DISTANCES)
        if p is not None:
            pairs[cell] = _npz(p, ("pos", "neg"))
    for r in board.rows:
        e = res.artifact(r.cell, tables.EMBEDDING_2D)
        if e is not None and len(embs) < MAX_EMBEDDINGS:
            embs[r.cell] = _npz(e, ("x", "y"))
        h = res.artifact(r.cell, tables.HISTORY)
        frame = _history_csv(h) if h is not None else _history_from_trials(res.trials, r.cell)
        if frame is not None and not frame.empty:
            hist[r.cell] = frame
    return Artifacts(pairs, embs, hist)


SCRIPT = """
(function () {
  var table = document.getElementById('leaderboard');
  var heads = table.tHead.rows[0].cells;
  function sortBy(col) {
    var th = heads[col];
    var asc = th.getAttribute('aria-sort') !== 'ascending';
    var numeric = th.dataset.type === 'num';
    var rows = Array.prototype.slice.call(table.tBodies[0].rows);
    rows.sort(function (a, b) {
      var x = a.cells[col].dataset.v, y = b.cells[col].dataset.v;
      if (numeric) { x = parseFloat(x); y = parseFloat(y);
        if (isNaN(x)) return 1; if (isNaN(y)) return -1; }
      var c = x < y ? -1 : x > y ? 1 : 0;
      return asc ? c : -c;
    });
    for (var i = 0; i < heads.length; i++) heads[i].removeAttribute('aria-sort');
    th.setAttribute('aria-sort', asc ? 'ascending' : 'descending');
    rows.forEach(function (r) { table.tBodies[0].appendChild(r); });
  }
  for (var i = 0; i < heads.length; i++) {
    (function (col) { heads[col].addEventListener('click', function () { sortBy(col); }); })(i);
  }
  // A link such as page.html#sort=cell opens the table sorted by that column (clicked once per mention).
  var m = /sort=([^&]+)/.exec(location.hash);
  if (m) { m[1].split(',').forEach(function (key) {
    for (var i = 0; i < heads.length; i++) if (heads[i].dataset.key === key) heads[i].click();
  }); }
  document.body.setAttribute('data-ready', 'yes');
})();
"""

STYLE = """
body { font-family: sans-serif; margin: 1.5em; color: #222; }
table { border-collapse: collapse; font-size: 13px; }
th, td { border: 1px solid #ccc; padding: 3px 6px; text-align: left; vertical-align: top; }
.warning { background: #fff3cd; border: 1px solid #e0a800; padding: 6px 10px; }
th { background: #f0f0f0; cursor: pointer; user-select: none; }
th[aria-sort=ascending]::after { content: " \\25B2"; }
th[aria-sort=descending]::after { content: " \\25BC"; }
tbody tr:nth-child(even) { background: #fafafa; }
tr.floor { background: #eef3fb; font-style: italic; }
tr.collapsed td { color: #999; }
.plots { display: flex; flex-wrap: wrap; gap: 12px; }
footer { margin-top: 2em; font-size: 12px; color: #555; }
code { font-size: 12px; }
"""


def _cell(text: str, value: object) -> str:
    v = "" if value is None or (isinstance(value, float) and not math.isfinite(value)) else value
    return f'<td data-v="{escape(str(v))}">{escape(text)}</td>'


def table(board: Board) -> str:
    """The leaderboard as a sortable HTML table (each cell keeps its raw value for sorting), floor row last."""
    heads: list[tuple[str, str, str]] = [("rank", "rank", "num"), ("cell", "cell", "text"), ("seeds", "seeds", "num")]
    heads += [(m, m, "num") for m in board.metrics]
    heads += [(h.replace(" ", "_"), h, "num") for h in budget_heads(board)]
    heads += [(k, h, "num") for k, h in zip(("tuning_sd", "seed_sd", "tuning_share"), split_heads(board))]
    heads += [
        (f"val_{board.primary}", f"val_{board.primary}", "num"),
        ("budget", "budget", "num"),
        ("device_s", "device-s", "num"),
        ("device", "device", "text"),
        ("params", "tuned hyperparameters", "text"),
        ("notes", "notes", "text"),
    ]
    th = "".join(f'<th data-key="{escape(k)}" data-type="{t}">{escape(label)}</th>' for k, label, t in heads)
    body = []
    for r in board.rows:
        tds = [_cell(str(r.rank), r.rank), _cell(r.cell, r.cell), _cell(str(r.n_seeds), r.n_seeds)]
        tds += [_cell(fmt_interval(r.metrics[m]), r.metrics[m].mean) for m in board.metrics]
        tds += [_cell(text, _budget_value(board, r.cell, i)) for i, text in enumerate(budget_cells(board, r))]
        tds += [_cell(text, value) for text, value in split_cells(board, r)]
        tds += [
            _cell(fmt(r.validation), r.validation),
            _cell(budget(r), r.trials),
            *(_cell(text, value) for text, value in compute_cells(r)),
            _cell(fmt_params(r.params), fmt_params(r.params)),
            _cell(notes(r), notes(r)),
        ]
        mark = ' class="collapsed"' if r.collapsed or r.not_shown_above else ""
        body.append(f'<tr data-cell="{escape(r.cell)}"{mark}>' + "".join(tds) + "</tr>")
    for cell, why in board.missing.items():  # a planned cell without a result is a row that says why
        tds = [_cell("-", None), _cell(cell, cell), _cell("0", 0)]
        tds += [_cell("-", None) for _ in range(len(heads) - 4)] + [_cell(f"no result: {why}", why)]
        body.append(f'<tr data-cell="{escape(cell)}" class="collapsed" data-missing="yes">' + "".join(tds) + "</tr>")
    if board.floor:
        n = max(iv.n for iv in board.floor.values())
        tds = [_cell("floor", None), _cell("untrained trunk", "untrained trunk"), _cell(str(n), n)]
        tds += [_cell(text, board.floor[m].mean) for text, m in zip(floor_cells(board), board.metrics)]
        tds += [_cell("-", None) for _ in [*budget_heads(board), *split_heads(board)]]
        tds += [_cell("-", None)] * (3 + len(COMPUTE_HEADS)) + [_cell("the same trunk before training", "")]
        body.append('<tr class="floor" data-floor="yes">' + "".join(tds) + "</tr>")
    return f'<table id="leaderboard"><thead><tr>{th}</tr></thead><tbody>\n' + "\n".join(body) + "\n</tbody></table>"


def _budget_value(board: Board, cell: str, column: int) -> float | None:
    """The raw number a budget check column sorts by: the metric at the multiple, the change, the rank."""
    b = board.budget
    change = b.changes.get(cell) if b is not None else None
    if b is None or change is None:
        return None
    return (change.at_multiple.mean, change.change.diff, b.ranks_at_multiple.get(cell))[column]


def _section(title: str, svgs: list[str], note: str = "") -> str:
    if not svgs:
        return ""
    p = f"<p>{escape(note)}</p>" if note else ""
    return f'<section><h2>{escape(title)}</h2>{p}<div class="plots">' + "\n".join(svgs) + "</div></section>"


def plots(board: Board, art: Artifacts) -> str:
    """The page's figures as inline SVG sections: intervals per metric, and what the artifacts allow."""
    rows = board.rows
    labels = [r.cell for r in rows]
    per_metric = [
        svg.ci_plot(
            labels,
            [r.metrics[m].mean for r in rows],
            [r.metrics[m].low for r in rows],
            [r.metrics[m].high for r in rows],
            f"{m} per cell (mean, 95% CI)",
            m,
        )
        for m in board.metrics
    ]
    p = board.primary
    transfer = (
        svg.scatter(
            [(r.validation, r.metrics[p].mean, r.cell) for r in rows],
            f"validation vs test {p}",
            f"validation {p} (best trial)",
            f"test {p} (mean over seeds)",
            yerr=[(r.metrics[p].low, r.metrics[p].high) for r in rows],
            diagonal=True,
            note=f"Spearman rank correlation {fmt(board.transfer, 2)}",
        )
        if any(math.isfinite(r.validation) for r in rows)
        else ""
    )
    dists = [
        svg.histograms({"positive pairs": pos, "negative pairs": neg}, f"{cell}: test pair distances", "distance")
        for cell, (pos, neg) in art.pair_distances.items()
    ]
    embs = [svg.points2d(x, y, f"{cell}: 2-D test embedding") for cell, (x, y) in art.embeddings.items()]
    hist = []
    for r in rows:
        h = art.history.get(r.cell)
        if h is None:
            continue
        trial = pd.to_numeric(h["trial"], errors="coerce").to_numpy(dtype=float)
        best = pd.to_numeric(h.get("best_so_far", h["value"]), errors="coerce").to_numpy(dtype=float)
        value = pd.to_numeric(h["value"], errors="coerce").to_numpy(dtype=float)
        hist.append(
            svg.lines(
                {"best so far": (trial, best)},
                f"{r.cell}: tuning history",
                "trial",
                f"validation {p}",
                markers={"trial": (trial, value)},
            )
        )
    return "\n".join(
        [
            _section("Metrics per cell", per_metric),
            _section(
                "Does tuning transfer?",
                [transfer] if transfer else [],
                "Each cell's best validation score (class-disjoint folds of training classes) against its test score; "
                "points far from the dashed line mean the validation folds mis-rank the methods.",
            ),
            _section(
                "Distance distributions of the best cells",
                dists,
                "Test distances of positive and negative pairs (first final seed); less overlap separates classes better.",
            ),
            _section("2-D embeddings", embs),
            _section("Optuna history", hist),
        ]
    )


def render(board: Board, art: Artifacts) -> str:
    """The whole page as one string."""
    foot = "".join(f"<li>{escape(line).replace('`', '')}</li>" for line in footer_lines(board))
    warns = "".join(f'<p class="warning"><strong>Warning:</strong> {escape(w)}</p>' for w in board.warnings)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>dmlbench leaderboard: {escape(board.protocol)}</title>
<style>{STYLE}</style></head>
<body>
<h1>dmlbench leaderboard: {escape(board.protocol)}</h1>
<p>Cells ranked by mean test <code>{escape(board.primary)}</code> over final seeds; each metric as mean [95% t-interval {escape(interval_unit(board))}]. Click a column header to sort.</p>
<p>{escape(NOTES)}</p>
{warns}
{table(board)}
{plots(board, art)}
<footer><ul>{foot}</ul></footer>
<script>{SCRIPT}</script>
</body></html>
"""
