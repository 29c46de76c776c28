"""`dmlbench leaderboard RESULTS`: Markdown (for a README) and a self-contained HTML page."""

from __future__ import annotations

from pathlib import Path

import click

from bench.errors import BenchError
from bench.reports import html, leaderboard, source
from bench.reports.files import write_text


@click.command("leaderboard")
@click.argument("results", type=click.Path(path_type=Path), required=False)
@click.option("--mlflow-experiment", "experiment", metavar="NAME",
              help="read the sweep from this MLflow experiment (`dmlbench/<protocol>`) instead of RESULTS")
@click.option("--tracking-uri", default=None,
              help="with --mlflow-experiment: the MLflow store [default: $MLFLOW_TRACKING_URI, then runs/mlflow.db]")
@click.option("--protocol-hash", default=None, metavar="PREFIX",
              help="with --mlflow-experiment: the protocol version, where the experiment holds several")
@click.option("--out", "out", type=click.Path(path_type=Path),
              help="with --mlflow-experiment: folder for the artifacts and pages [default: leaderboards/<protocol>]")
@click.option("--markdown", "md_path", type=click.Path(path_type=Path),
              help="where to write the Markdown table [default: RESULTS/leaderboard.md]")
@click.option("--html", "html_path", type=click.Path(path_type=Path),
              help="where to write the HTML page [default: RESULTS/leaderboard.html]")
@click.option("--quiet", is_flag=True, help="do not print the Markdown table")
def command(results: Path | None, experiment: str | None, tracking_uri: str | None, protocol_hash: str | None,
            out: Path | None, md_path: Path | None, html_path: Path | None, quiet: bool) -> None:
    """Rank the cells of RESULTS (results/<protocol>/), or of an MLflow experiment, by the primary metric."""
    if (results is None) == (experiment is None):
        raise BenchError("leaderboard: give a results directory or --mlflow-experiment NAME (one of the two)")
    if experiment is None:
        res = source.load(results)
    else:
        from bench.reports import mlflow_source

        name = experiment.removeprefix(mlflow_source.PREFIX)
        res = mlflow_source.load(experiment, out or Path("leaderboards") / name, tracking_uri, protocol_hash)
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
