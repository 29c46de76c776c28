"""`dmlbench claims FILE`: a verdict for each published claim, written beside the results."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from bench.atomic import write_json, write_text
from bench.commands._output import emit, format_option, log, quiet_option


def _rows(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The JSON report's verdicts without the per-seed records, one CSV line each."""
    return [{k: v for k, v in verdict.items() if k != "records"} for verdict in doc["verdicts"]]


@click.command("claims")
@click.argument("claims_file", type=click.Path(path_type=Path))
@click.option(
    "--results",
    type=click.Path(path_type=Path),
    help="results directory [default: the file's `results`, else results/<protocol>]",
)
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    help="folder for the verdicts [default: the results directory]: claims.md and claims.json for the "
    "protocol's own claims file (named after the protocol), claims-<file name>.md and .json for any other",
)
@format_option
@quiet_option
def command(claims_file: Path, results: Path | None, out: Path | None, fmt: str, quiet: bool) -> int:
    """Judge every claim of CLAIMS_FILE: supported, contradicted, inconclusive or not testable.

    Verdicts are findings, not failures: the exit status is 0 whatever they
    are, and 2 when the file or the results cannot be used.
    """
    from bench.reports import claims, source

    cf = claims.parse(claims_file)
    res = source.load(claims.resolve_results_dir(cf, results))
    verdicts = claims.evaluate(cf, res)
    doc = claims.to_json(cf, res, verdicts)
    folder = out or res.root
    md_name, json_name = claims.output_names(cf)  # keyed by the claims file: another one's verdicts are kept
    write_text(folder / md_name, claims.markdown(cf, res, verdicts))
    write_json(folder / json_name, doc)
    emit(
        fmt,
        lambda: "\n".join([claims.text_table(verdicts), *claims.version_lines(res)]),
        lambda: _rows(doc),
        lambda: doc,
    )
    log.info(f"wrote {folder / md_name} and {folder / json_name}")
    return 0
