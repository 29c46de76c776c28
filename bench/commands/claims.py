"""`dmlbench claims FILE`: a verdict for each published claim, written beside the results."""

from __future__ import annotations

from pathlib import Path

import click

from bench.reports import claims, source
from bench.reports.files import write_json, write_text


@click.command("claims")
@click.argument("claims_file", type=click.Path(path_type=Path))
@click.option("--results", type=click.Path(path_type=Path),
              help="results directory [default: the file's `results`, else results/<protocol>]")
@click.option("--out", type=click.Path(path_type=Path),
              help="folder for claims.md and claims.json [default: the results directory]")
def command(claims_file: Path, results: Path | None, out: Path | None) -> None:
    """Judge every claim of CLAIMS_FILE: supported, contradicted, inconclusive or not testable.

    Verdicts are findings, not failures: the exit status is 0 whatever they
    are, and 2 when the file or the results cannot be used.
    """
    cf = claims.parse(claims_file)
    res = source.load(claims.resolve_results_dir(cf, results))
    verdicts = claims.evaluate(cf, res)
    folder = out or res.root
    write_text(folder / "claims.md", claims.markdown(cf, res, verdicts))
    write_json(folder / "claims.json", claims.to_json(cf, res, verdicts))
    click.echo(claims.text_table(verdicts))
    click.echo(f"wrote {folder / 'claims.md'} and {folder / 'claims.json'}")
