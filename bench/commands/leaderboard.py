"""`dmlbench leaderboard RESULTS`: Markdown (for a README) and a self-contained HTML page."""

from __future__ import annotations

from pathlib import Path

import click

from bench.reports import html, leaderboard, source
from bench.reports.files import write_text


@click.command("leaderboard")
@click.argument("results", type=click.Path(path_type=Path))
@click.option("--markdown", "md_path", type=click.Path(path_type=Path),
              help="where to write the Markdown table [default: RESULTS/leaderboard.md]")
@click.option("--html", "html_path", type=click.Path(path_type=Path),
              help="where to write the HTML page [default: RESULTS/leaderboard.html]")
@click.option("--quiet", is_flag=True, help="do not print the Markdown table")
def command(results: Path, md_path: Path | None, html_path: Path | None, quiet: bool) -> None:
    """Rank the cells of RESULTS (results/<protocol>/) by the protocol's primary metric."""
    res = source.load(results)
    board = leaderboard.build(res)
    md = leaderboard.markdown(board)
    page = html.render(board, html.collect(res, board))
    md_path = md_path or res.root / "leaderboard.md"
    html_path = html_path or res.root / "leaderboard.html"
    write_text(md_path, md)
    write_text(html_path, page)
    if not quiet:
        click.echo(md)
    click.echo(f"wrote {md_path} and {html_path}")
