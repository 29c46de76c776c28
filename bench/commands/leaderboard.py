"""`dmlbench leaderboard RESULTS`: Markdown (for a README) and a self-contained HTML page."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from bench.atomic import write_text
from bench.cli import quiet_libraries
from bench.commands._output import emit, format_option, log, quiet_option
from bench.errors import BenchError

if TYPE_CHECKING:
    from bench.reports.leaderboard.board import Board
    from bench.reports.source import Results


def table(board: Board, res: Results) -> str:
    """The aligned terminal table (`leaderboard.text`), with a line for each cell whose final seeds all failed:
    what `dmlbench run` prints when it finishes and `dmlbench leaderboard --format table` prints."""
    from bench.reports import leaderboard

    lines = [leaderboard.text(board)]
    ranked = {r.cell for r in board.rows}
    for cell, cell_rows in res.finals.groupby(res.finals["cell"].astype(str), sort=True):
        if cell not in ranked:
            reasons = sorted({str(r) for r in cell_rows.get("reason", []) if isinstance(r, str) and r})
            lines.append(f"no completed final seed: {cell}" + (f" ({reasons[0]})" if reasons else ""))
    return "\n".join(lines)


def rows(board: Board) -> list[dict[str, Any]]:
    """One row per ranked cell; each metric as mean, 95% interval bounds and seed count."""
    out = []
    for r in board.rows:
        row: dict[str, Any] = {"rank": r.rank, "cell": r.cell, "seeds": r.n_seeds}
        for name in board.metrics:
            iv = r.metrics[name]
            row.update({name: iv.mean, f"{name}_ci_low": iv.low, f"{name}_ci_high": iv.high})
        if board.budget is not None:  # the same keys in every row (a CSV has one header), NaN where unchecked
            change = board.budget.changes.get(r.cell)
            nan = math.nan
            row.update(
                {
                    f"{board.primary}_at_multiple": change.at_multiple.mean if change else nan,
                    "change": change.change.diff if change else nan,
                    "change_ci_low": change.change.low if change else nan,
                    "change_ci_high": change.change.high if change else nan,
                    "rank_at_multiple": board.budget.ranks_at_multiple.get(r.cell, nan),
                }
            )
        row.update(
            {
                f"val_{board.primary}": r.validation,
                "trials": r.trials,
                "trials_complete": r.trials_complete,
                "iterations": r.total_iterations,
                "samples": r.total_samples,
                "wall_time_s": r.wall_time_s,
                "device_s": r.device_s,
                "device": "; ".join(r.devices),
                **_split(board, r),
                "params": r.params,
            }
        )
        out.append(row)
    return out


def _split(board: Board, r: Any) -> dict[str, Any]:
    """Under tuning.repeats the primary metric's tuning SD, seed SD and tuning share (NaN for a cell without)."""
    if not board.draws:
        return {}
    s = r.split
    nan = math.nan
    return {
        "tuning_sd": s.tuning_sd if s else nan,
        "seed_sd": s.seed_sd if s else nan,
        "tuning_share": s.share if s else nan,
        "tuning_share_ci_low": s.share_low if s else nan,
        "tuning_share_ci_high": s.share_high if s else nan,
    }


def _compute(board: Board) -> dict[str, Any] | None:
    c = board.compute
    if c is None:
        return None
    return {"iterations": c.iterations, "device_s": c.device_s, "devices": list(c.devices), "wall_s": c.wall_s}


def document(board: Board) -> dict[str, Any]:
    """The JSON form: the rows with what makes them comparable (protocol hash, fingerprints, metric)."""
    return {
        "protocol": board.protocol,
        "protocol_hash": board.protocol_hash,
        "primary": board.primary,
        "fingerprints": board.fingerprints,
        "refused": board.manifest.get("refused") or {},
        "cells": rows(board),
        "budget_check": _budget(board),
        "compute": _compute(board),
    }


def _budget(board: Board) -> dict[str, Any] | None:
    """The budget check's table-level facts: the multiple, Kendall's tau, the cells that moved or were not checked."""
    b = board.budget
    if b is None:
        return None
    return {
        "multiple": b.multiple,
        "iterations": b.iterations,
        "metric": b.metric,
        "kendall_tau": b.tau if math.isfinite(b.tau) else None,
        "moved": b.moved,
        "not_checked": b.missing,
        "stable": b.stable,
    }


@click.command("leaderboard")
@click.argument("results", type=click.Path(path_type=Path), required=False)
@click.option(
    "--mlflow-experiment",
    "experiment",
    metavar="NAME",
    help="read the sweep from this MLflow experiment (`dmlbench/<protocol>`) instead of RESULTS",
)
@click.option(
    "--tracking-uri",
    default=None,
    help="with --mlflow-experiment: the MLflow store [default: $MLFLOW_TRACKING_URI, then runs/mlflow.db]",
)
@click.option(
    "--protocol-hash",
    default=None,
    metavar="PREFIX",
    help="with --mlflow-experiment: the protocol version, where the experiment holds several",
)
@click.option(
    "--out",
    "out",
    type=click.Path(path_type=Path),
    help="with --mlflow-experiment: folder for the artifacts and pages [default: leaderboards/<protocol>]",
)
@click.option(
    "--markdown",
    "md_path",
    type=click.Path(path_type=Path),
    help="where to write the Markdown table [default: RESULTS/leaderboard.md]",
)
@click.option(
    "--html",
    "html_path",
    type=click.Path(path_type=Path),
    help="where to write the HTML page [default: RESULTS/leaderboard.html]",
)
@format_option
@quiet_option
def command(
    results: Path | None,
    experiment: str | None,
    tracking_uri: str | None,
    protocol_hash: str | None,
    out: Path | None,
    md_path: Path | None,
    html_path: Path | None,
    fmt: str,
    quiet: bool,
) -> int:
    """Rank the cells of RESULTS (results/<protocol>/), or of an MLflow experiment, by the primary metric.

    Writes the Markdown table and the HTML page, and prints the table: with
    --format table the aligned one `dmlbench run` prints (the Markdown is in
    the file written).
    """
    from bench.reports import html, leaderboard, source

    if (results is None) == (experiment is None):
        raise BenchError("leaderboard: give a results directory or --mlflow-experiment NAME (one of the two)")
    if results is not None:
        res = source.load(results)
    elif experiment is not None:
        from bench.reports import mlflow_source

        quiet_libraries()
        name = experiment.removeprefix(mlflow_source.PREFIX)
        res = mlflow_source.load(experiment, out or Path("leaderboards") / name, tracking_uri, protocol_hash)
    board = leaderboard.build(res)
    md = leaderboard.markdown(board)
    page = html.render(board, html.collect(res, board))
    md_path = md_path or res.root / "leaderboard.md"
    html_path = html_path or res.root / "leaderboard.html"
    write_text(md_path, md)
    write_text(html_path, page)
    emit(fmt, lambda: table(board, res), lambda: rows(board), lambda: document(board))
    log.info(f"wrote {md_path} and {html_path}")
    return 0
