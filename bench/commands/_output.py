"""What every command shares: `--format`, `--quiet`, and where tables and notices go.

A command's result (its table) goes to stdout, in the form `--format` asks
for, so that `dmlbench regress ... --format json | jq` works; everything
said about the work (progress, "wrote ...") goes through the `dmlbench`
logger to stderr, and `--quiet` raises that logger to WARNING. Optuna's CLI
draws the same line between its `--format` output and its log.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import math
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import click

log = logging.getLogger("dmlbench.cli")

FORMATS = ("table", "csv", "json")

F = TypeVar("F", bound=Callable[..., Any])


def format_option(f: F) -> F:
    """`--format table|csv|json` for a command that prints a table."""
    return click.option(
        "--format",
        "fmt",
        type=click.Choice(FORMATS),
        default="table",
        show_default=True,
        help="how the table is printed on stdout: aligned text, CSV, or JSON",
    )(f)


def _set_quiet(ctx: click.Context, param: click.Parameter, quiet: bool) -> bool:
    if quiet:
        logging.getLogger("dmlbench").setLevel(logging.WARNING)
    return quiet


def quiet_option(f: F) -> F:
    """`-q/--quiet` with one meaning on every command."""
    return click.option(
        "-q",
        "--quiet",
        is_flag=True,
        callback=_set_quiet,
        help="no progress bars and no notices on stderr (warnings and errors still show); "
        "the result on stdout is unchanged",
    )(f)


def _plain(value: Any) -> Any:
    """JSON-safe: NaN and infinities become null, tuples lists, other objects their text."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, (str, int, bool)):
        return value
    if hasattr(value, "item"):  # numpy scalars
        return _plain(value.item())
    return str(value)


def to_json(doc: Any) -> str:
    """Strict JSON text (no NaN), the form `--format json` prints."""
    return json.dumps(_plain(doc), indent=2, allow_nan=False)


def to_csv(rows: Sequence[dict[str, Any]]) -> str:
    """One line per row, columns in first-seen order; nested values as JSON text."""
    columns: dict[str, None] = {}
    for row in rows:
        columns.update(dict.fromkeys(row))
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(columns), lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow(
            {k: json.dumps(_plain(v)) if isinstance(v, (dict, list, tuple)) else _plain(v) for k, v in row.items()}
        )
    return out.getvalue().rstrip("\n")


def emit(
    fmt: str,
    text: Callable[[], str],
    rows: Callable[[], Sequence[dict[str, Any]]],
    doc: Callable[[], Any] | None = None,
) -> None:
    """Print a table as `fmt` asks: `text()` for table, `rows()` as CSV, `doc()` (default the rows) as JSON."""
    if fmt == "table":
        click.echo(text())
    elif fmt == "csv":
        click.echo(to_csv(rows()))
    else:
        click.echo(to_json(doc() if doc is not None else list(rows())))
