"""`dmlbench regress --baseline A --current B`: exit 1 when a cell's primary metric regressed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from bench.atomic import write_json
from bench.commands._output import emit, format_option, log, quiet_option
from bench.reports import regress, source


def _rows(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The JSON report's cells flattened to one CSV line each."""
    out = []
    for c in doc["cells"]:
        row: dict[str, Any] = {"cell": c["cell"], "status": c["status"]}
        for side in ("baseline", "current", "change"):
            for key, value in (c[side] or {}).items():
                row[f"{side}_{key}"] = value
        out.append(row)
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
    "--alpha", default=regress.ALPHA, show_default=True, type=float, help="level of Welch's one-sided test over seeds"
)
@click.option("--metric", default=None, help="metric to compare [default: the protocol's primary]")
@click.option("--allow-missing", is_flag=True, help="a cell absent from the current run does not fail the check")
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

    Exit 0: no regression; 1: at least one cell regressed (or went missing, holds a NaN, or has a seed the
    baseline lacks);
    2: the tables cannot be compared (other protocol hash or split fingerprints).
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
