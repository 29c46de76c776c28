"""`dmlbench regress --baseline A --current B`: exit 1 when a cell's primary metric regressed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from bench.atomic import write_json
from bench.commands._output import emit, format_option, log, quiet_option
from bench.reports import regress, source


def _rows(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The JSON report's cells flattened to one CSV line each (problems joined by "; "), then a row with
    status `missing columns` when the current table lacks a column of the baseline."""
    out = []
    for c in doc["cells"]:
        row: dict[str, Any] = {"cell": c["cell"], "status": c["status"], "test": c["test"]}
        for side in ("baseline", "current", "change"):
            for key, value in (c[side] or {}).items():
                if key != "test":
                    row[f"{side}_{key}"] = value
        row["problems"] = "; ".join(c["problems"])
        out.append(row)
    if doc["missing_columns"]:  # a finding about the table, not a cell: one row of its own, so CSV keeps it
        out.append({"cell": "", "status": "missing columns", "problems": "; ".join(doc["missing_columns"])})
    return out


@click.command("regress")
@click.option("--baseline", required=True, type=click.Path(path_type=Path), help="results directory to compare against")
@click.option(
    "--current", required=True, type=click.Path(path_type=Path), help="results directory of the run under test"
)
@click.option(
    "--tolerance",
    default=regress.TOLERANCE,
    show_default=True,
    type=float,
    help="smallest absolute drop of the metric that counts",
)
@click.option(
    "--alpha",
    default=regress.ALPHA,
    show_default=True,
    type=float,
    help="level of the one-sided test of a drop (paired by seed, else Welch)",
)
@click.option("--metric", default=None, help="metric to compare [default: the protocol's primary]")
@click.option(
    "--allow-missing",
    is_flag=True,
    help="a cell absent from the current run (or dropped from its protocol) does not fail the check",
)
@click.option("--json", "json_path", type=click.Path(path_type=Path), help="also write the comparison as JSON here")
@format_option
@quiet_option
def command(
    baseline: Path,
    current: Path,
    tolerance: float,
    alpha: float,
    metric: str | None,
    allow_missing: bool,
    json_path: Path | None,
    fmt: str,
    quiet: bool,
) -> int:
    """Compare two results tables of the same protocol cell by cell.

    A cell fails when the current tables lack anything of it the baseline has (the cell, a final seed, a
    value: missing, failed, NaN, inf or empty) or when its mean dropped by more than --tolerance with a
    one-sided p below --alpha (paired t-test over the same final seeds, else Welch).

    Two versions of a protocol that differ only by their cells are compared on the cells they share (same
    cell key); cells added and dropped (a failure, as a missing cell) are named in one line each.

    Exit 0: no cell failed; 1: a cell failed or was dropped, or a metric column of the baseline is missing;
    2: the tables cannot be compared (other shared settings, or protocol hash for results without cell
    keys, or split fingerprints, the compared metric absent, an empty or unreadable finals table).
    """
    cmp = regress.compare(
        source.load(baseline, complete=False),
        source.load(current, complete=False),
        metric,
        tolerance,
        alpha,
        allow_missing,
    )
    doc = regress.to_json(cmp)
    emit(fmt, lambda: regress.text_table(cmp), lambda: _rows(doc), lambda: doc)
    if json_path is not None:
        write_json(json_path, doc)
        log.info(f"wrote {json_path}")
    return int(cmp.exit_code)
