"""`dmlbench merge OUT JOB...`: the results of jobs that each ran some of a protocol's cells, in one folder."""

from __future__ import annotations

from pathlib import Path

import click

from bench.commands._output import log, quiet_option


@click.command("merge")
@click.argument("out", type=click.Path(path_type=Path))
@click.argument("jobs", nargs=-1, required=True, type=click.Path(path_type=Path))
@quiet_option
def command(out: Path, jobs: tuple[Path, ...], quiet: bool) -> int:
    """Join the results folders JOBS (each `dmlbench run P --cells ... --results-dir rN` with its own stores)
    into OUT, a new folder: the tables, manifest and artifacts of one sweep of those cells (bench/sweep/merge.py).

    Refused (one line, exit 2, nothing written): jobs of other shared settings, data, protocol version, budget or
    seeds, a cell run by two jobs, a job not finished. Exit 1: a planned cell no job ran (named, and listed in
    the manifest's `not_run`); 0: every planned cell is there.
    """
    from bench.sweep.merge import merge

    manifest = merge(out, list(jobs))
    cells, not_run = manifest["cells"], manifest["not_run"]
    log.info(f"merged {len(jobs)} jobs: {len(cells)} cells of {manifest['protocol']} in {out}")
    if not_run:
        log.error(
            f"dmlbench: {len(not_run)} planned cell(s) were run by no job ({', '.join(not_run)}); the manifest "
            "lists them under not_run, and a merge without them is not a finished comparison"
        )
        return 1
    return 0
